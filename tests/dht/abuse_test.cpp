// What one hostile peer can make a node hold or send: one key's records are capped so that a
// find can always carry them, a find answer stays within its byte budget however many times a
// request names one big key, a store request is looked at up to max_records_per_store records,
// each peer keeps at most its quota stored here, and warnings about one peer are rate-limited.
#include <gtest/gtest.h>

#include "starling/crypto/keys.hpp"
#include "starling/dht/core.hpp"
#include "starling/dht/store.hpp"

using namespace starling;
using namespace starling::dht;

namespace {
net::PeerId new_peer() {
  return net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
}
Record entry(const std::string& sk, std::size_t bytes, std::uint64_t version = 1) {
  return Record{SubKey::from_string(sk), RecordBody{Bytes(bytes, 0x5a), version, {}, {}}, 10min};
}
const NodeHeader kServer{false, {to_bytes("/ip4/127.0.0.1/tcp/1")}};
}  // namespace

TEST(DhtAbuse, OneKeyHoldsAtMostItsByteLimitAndReplacingAnEntryStillWorks) {
  RecordStore::Limits lim;
  lim.max_bytes_per_key = 10'000;
  RecordStore store(lim);
  const TimePoint now{};
  const auto key = RecordKey::from_string("shared");
  std::size_t accepted = 0;
  result<MergeResult> last = MergeResult::stored;
  for (int i = 0; i < 20 && last; ++i) {
    const auto r = entry("w" + std::to_string(i), 1000);
    last = store.put(key, r.subkey, r.body, now + 1min, now);
    if (last) ++accepted;
  }
  ASSERT_FALSE(last);
  EXPECT_EQ(last.error(), dht_errc::capacity);
  EXPECT_GE(accepted, 8u);
  EXPECT_LE(store.find(key.id(), now)->byte_size(), lim.max_bytes_per_key);
  // A newer version of an entry already held replaces it within the limit.
  const auto update = entry("w0", 1000, 2);
  EXPECT_TRUE(store.put(key, update.subkey, update.body, now + 1min, now));
  // One record larger than the limit is refused outright.
  const auto huge = entry("big", 20'000);
  EXPECT_FALSE(store.put(RecordKey::from_string("other"), huge.subkey, huge.body, now + 1min, now));
}

TEST(DhtAbuse, FindNamingOneBigKeyManyTimesAnswersItsRecordsOnceWithinTheBudget) {
  DhtConfig cfg;
  cfg.limits.max_message_bytes = 64 * 1024;  // budget for records: 32 KiB
  cfg.max_bytes_per_key = 30 * 1024;
  DhtCore core(cfg, new_peer(), ValidatorChain::standard(), 1);
  const Now now{TimePoint{} + 1h, WallTime{}};
  const auto writer = new_peer();
  const auto big = RecordKey::from_string("big"), other = RecordKey::from_string("other");
  StoreRequest st;
  StoreItem a{big, {}}, b{other, {}};
  for (int i = 0; i < 20; ++i) a.records.push_back(entry("s" + std::to_string(i), 1000));
  b.records.push_back(entry("x", 16000));  // more than the ~12 KiB left
  st.items = {a, b};
  auto stored = core.handle_request(writer, Request{kServer, st}, now);
  for (auto s : std::get<StoreResponse>(stored.body).status) EXPECT_EQ(s, StoreStatus::accepted);

  FindRequest f;
  f.want_values = true;
  for (int i = 0; i < 64; ++i) f.targets.push_back(big.id());
  f.targets.push_back(other.id());
  auto resp = core.handle_request(new_peer(), Request{kServer, f}, now);
  const auto& results = std::get<FindResponse>(resp.body).results;
  ASSERT_EQ(results.size(), f.targets.size());
  EXPECT_EQ(results.front().records.size(), 20u);  // the first mention carries the records
  std::size_t records = 0;
  for (const auto& r : results) records += r.records.size();
  // Only once; "other" does not fit in what is left of the 32 KiB budget (~11 KiB).
  EXPECT_EQ(records, 20u);
  EXPECT_TRUE(results.back().records.empty());
  // Asked alone, "other" is answered.
  FindRequest alone;
  alone.want_values = true;
  alone.targets = {other.id()};
  auto r2 = core.handle_request(new_peer(), Request{kServer, alone}, now);
  EXPECT_EQ(std::get<FindResponse>(r2.body).results.front().records.size(), 1u);
}

namespace {
StoreRequest many(const std::string& key_prefix, std::size_t n, std::size_t bytes,
                  bool one_key = false) {
  StoreRequest st;
  for (std::size_t i = 0; i < n; ++i) {
    const auto key = RecordKey::from_string(key_prefix + (one_key ? "" : std::to_string(i)));
    if (st.items.empty() || !(st.items.back().key.id() == key.id()))
      st.items.push_back(StoreItem{key, {}});
    st.items.back().records.push_back(entry("s" + std::to_string(i), bytes));
  }
  return st;
}
std::size_t count(const Response& r, StoreStatus want) {
  std::size_t n = 0;
  for (auto s : std::get<StoreResponse>(r.body).status) n += s == want;
  return n;
}
}  // namespace

TEST(DhtAbuse, AStoreRequestIsLookedAtUpToMaxRecordsPerStore) {
  DhtConfig cfg;  // max_records_per_store = 256
  DhtCore core(cfg, new_peer(), ValidatorChain::standard(), 1);
  const Now now{TimePoint{} + 1h, WallTime{}};
  auto resp = core.handle_request(new_peer(), Request{kServer, many("k", 300, 10, true)}, now);
  EXPECT_EQ(count(resp, StoreStatus::accepted), 256u);
  EXPECT_EQ(count(resp, StoreStatus::full), 44u);
  EXPECT_EQ(core.records().item_count(), 256u);
}

TEST(DhtAbuse, OnePeerKeepsAtMostItsQuotaAndOthersAreNotAffected) {
  DhtConfig cfg;
  cfg.max_records_per_source = 50;
  cfg.max_bytes_per_source = 64 * 1024;
  DhtCore core(cfg, new_peer(), ValidatorChain::standard(), 1);
  const Now now{TimePoint{} + 1h, WallTime{}};
  const auto flood = new_peer(), big = new_peer(), honest = new_peer();
  // Records: refuse-new beyond 50; the first 50 stay.
  auto r1 = core.handle_request(flood, Request{kServer, many("f", 60, 10)}, now);
  EXPECT_EQ(count(r1, StoreStatus::accepted), 50u);
  EXPECT_EQ(count(r1, StoreStatus::full), 10u);
  EXPECT_EQ(core.records().usage_of(flood).records, 50u);
  // Bytes: 10 KiB records, 64 KiB quota.
  auto r2 = core.handle_request(big, Request{kServer, many("b", 10, 10 * 1024)}, now);
  EXPECT_EQ(count(r2, StoreStatus::accepted), 6u);
  EXPECT_LE(core.records().usage_of(big).bytes, cfg.max_bytes_per_source);
  // Somebody else stores as before.
  auto r3 = core.handle_request(honest, Request{kServer, many("h", 20, 10)}, now);
  EXPECT_EQ(count(r3, StoreStatus::accepted), 20u);
  // Rewriting an item it pays for stays within its quota; a newer version written by another
  // peer moves the charge.
  StoreRequest again;
  again.items.push_back(StoreItem{RecordKey::from_string("f0"), {entry("s0", 10, 2)}});
  EXPECT_EQ(count(core.handle_request(flood, Request{kServer, again}, now), StoreStatus::accepted),
            1u);
  again.items.back().records.back().body.version = 3;
  EXPECT_EQ(count(core.handle_request(honest, Request{kServer, again}, now), StoreStatus::accepted),
            1u);
  EXPECT_EQ(core.records().usage_of(flood).records, 49u);
  EXPECT_EQ(core.records().usage_of(honest).records, 21u);
  // Expired records no longer count: the flooder may store again.
  const Now later{now.mono + 11min, now.wall + 11min};
  core.tick(later);
  EXPECT_EQ(core.records().usage_of(flood).records, 0u);
  auto r4 = core.handle_request(flood, Request{kServer, many("g", 5, 10)}, later);
  EXPECT_EQ(count(r4, StoreStatus::accepted), 5u);
}

TEST(DhtAbuse, APlainWriteThatDropsDictionaryEntriesReleasesTheirCharge) {
  RecordStore store;
  const TimePoint now{};
  const auto key = RecordKey::from_string("mixed");
  const auto writer = new_peer(), other = new_peer();
  for (int i = 0; i < 5; ++i) {
    const auto r = entry("e" + std::to_string(i), 100, 1);
    ASSERT_TRUE(store.put(key, r.subkey, r.body, now + 1min, now, &writer));
  }
  EXPECT_EQ(store.usage_of(writer).records, 5u);
  const RecordBody plain_body{Bytes(10, 1), 5, {}, {}};
  ASSERT_TRUE(store.put(key, std::nullopt, plain_body, now + 1min, now, &other));
  EXPECT_EQ(store.usage_of(writer).records, 0u);
  EXPECT_EQ(store.usage_of(writer).bytes, 0u);
  EXPECT_EQ(store.usage_of(other).records, 1u);
}

TEST(DhtAbuse, WarningsAboutOnePeerAreRateLimited) {
  DhtConfig cfg;
  DhtCore core(cfg, new_peer(), ValidatorChain::standard(), 1);
  const auto a = new_peer(), b = new_peer();
  const TimePoint t{1h};
  EXPECT_TRUE(core.warn_allowed(a, t));
  EXPECT_FALSE(core.warn_allowed(a, t + 1s));
  EXPECT_FALSE(core.warn_allowed(a, t + 9s));
  EXPECT_TRUE(core.warn_allowed(b, t + 9s));  // per peer
  EXPECT_TRUE(core.warn_allowed(a, t + 10s));
}
