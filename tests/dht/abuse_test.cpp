// What one hostile peer can make a node hold or send: one key's records are capped so that a
// find can always carry them, and a find answer stays within its byte budget however many
// times a request names one big key.
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
