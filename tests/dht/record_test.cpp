// Ids, the merge rule (newest per sub-key wins), expiry and the record store.
#include <gtest/gtest.h>

#include <algorithm>

#include "starling/dht/store.hpp"

using namespace starling;
using namespace starling::dht;

namespace {
const TimePoint t0 = TimePoint{} + std::chrono::hours(1);
RecordBody body(std::string v, std::uint64_t version) {
  return RecordBody{to_bytes(v), version, {}, {}};
}
std::string val(const Entry* e) {
  return e ? std::string(as_string(e->body.value)) : "<none>";
}
}  // namespace

TEST(DhtId, XorMetricAndPrefixes) {
  std::mt19937_64 rng(1);
  const DhtId a = DhtId::random(rng), b = DhtId::random(rng);
  EXPECT_EQ((a ^ b) ^ b, a);
  EXPECT_EQ((a ^ a).leading_zeros(), DhtId::kBits);
  EXPECT_EQ(a.common_prefix_length(a), DhtId::kBits);
  // Flipping bit i leaves exactly i common leading bits.
  for (std::size_t i : {0u, 1u, 7u, 8u, 100u, 255u})
    EXPECT_EQ(a.common_prefix_length(a.with_bit(i, !a.bit(i))), i);
  for (std::size_t depth : {0u, 3u, 8u, 13u, 200u, 256u}) {
    DhtId r = DhtId::random_with_prefix(a, depth, rng);
    EXPECT_GE(r.common_prefix_length(a), depth);
    EXPECT_EQ(r.masked(depth), a.masked(depth));
  }
  EXPECT_TRUE(closer(a, a, b));
  EXPECT_FALSE(closer(a, b, b));
  // Key ids are SHA-256 of the key bytes (FIPS 180-2 test vector "abc").
  EXPECT_EQ(RecordKey::from_string("abc").id().to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_FALSE(DhtId::from_bytes(Bytes(31, 0)));
}

TEST(Slot, NewestWinsPerSubKeyInAnyOrder) {
  // Every permutation of the same writes must end in the same state.
  struct W {
    std::optional<std::string> sk;
    std::string v;
    std::uint64_t ver;
  };
  std::vector<W> writes = {{"a", "a1", 10},         {"a", "a2", 20}, {"b", "b1", 15},
                           {std::nullopt, "p", 12}, {"c", "c1", 11}, {"b", "b0", 15}};
  std::vector<int> order(writes.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::optional<std::vector<Record>> reference;
  do {
    Slot s;
    for (int i : order) {
      const auto& w = writes[static_cast<std::size_t>(i)];
      s.merge(w.sk ? std::optional<SubKey>(SubKey::from_string(*w.sk)) : std::nullopt,
              body(w.v, w.ver), t0 + 10s);
    }
    auto recs = s.to_records(t0);
    if (!reference) reference = recs;
    ASSERT_EQ(recs, *reference);
  } while (std::next_permutation(order.begin(), order.end()));
  // The expected state, derived by hand from the rule: the plain value (version 12) drops the
  // entries with version <= 12 ("c" at 11, "a" at 10); "a" at 20 and "b" at 15 survive, and of
  // the two "b" writes at version 15, the larger value "b1" wins.
  Slot s;
  for (const auto& w : writes)
    s.merge(w.sk ? std::optional<SubKey>(SubKey::from_string(*w.sk)) : std::nullopt,
            body(w.v, w.ver), t0 + 10s);
  EXPECT_TRUE(s.is_dictionary());
  EXPECT_EQ(s.dictionary().size(), 2u);
  EXPECT_EQ(val(s.find(SubKey::from_string("a"))), "a2");
  EXPECT_EQ(val(s.find(SubKey::from_string("b"))), "b1");
  EXPECT_EQ(val(s.find(SubKey::from_string("c"))), "<none>");
  EXPECT_EQ(val(s.find(std::nullopt)), "p");
}

TEST(Slot, MergeResultsAndPlainReplacesOlderDictionary) {
  Slot s;
  const auto a = SubKey::from_string("a");
  EXPECT_EQ(s.merge(a, body("x", 5), t0 + 5s), MergeResult::stored);
  EXPECT_EQ(s.merge(a, body("x", 5), t0 + 9s), MergeResult::refreshed);
  EXPECT_EQ(s.merge(a, body("x", 5), t0 + 1s), MergeResult::unchanged);
  EXPECT_EQ(s.find(a)->deadline, t0 + 9s);
  EXPECT_EQ(s.merge(a, body("old", 4), t0 + 9s), MergeResult::stale);
  EXPECT_EQ(s.merge(std::nullopt, body("plain", 7), t0 + 9s), MergeResult::stored);
  EXPECT_FALSE(s.is_dictionary());
  EXPECT_EQ(s.merge(SubKey::from_string("b"), body("late", 7), t0 + 9s), MergeResult::stale);
  EXPECT_EQ(s.merge(SubKey::from_string("b"), body("new", 8), t0 + 9s), MergeResult::stored);
  EXPECT_TRUE(s.is_dictionary());
}

TEST(Slot, ExpiryAndRemainingTtl) {
  Slot s;
  s.merge(SubKey::from_string("short"), body("s", 1), t0 + 2s);
  s.merge(SubKey::from_string("long"), body("l", 1), t0 + 60s);
  auto recs = s.to_records(t0 + 1500ms);
  ASSERT_EQ(recs.size(), 2u);
  for (const auto& r : recs)
    EXPECT_EQ(r.ttl, r.subkey->to_string() == "\"short\"" ? Millis(500) : Millis(58500));
  EXPECT_EQ(s.to_records(t0 + 2s).size(), 1u);  // due at its deadline
  s.expire(t0 + 2s);
  EXPECT_EQ(s.item_count(), 1u);
  s.expire(t0 + 60s);
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.byte_size(), 0u);
}

TEST(VersionClock, MonotonicAndBoundedObserve) {
  VersionClock c;
  const WallTime w = WallTime(std::chrono::seconds(1'700'000'000));
  const auto v1 = c.next(w);
  EXPECT_EQ(v1, static_cast<std::uint64_t>(wall_micros(w)));
  EXPECT_GT(c.next(w - 10s), v1);  // the wall clock stepped back: still increasing
  c.observe(static_cast<std::uint64_t>(wall_micros(w + 1h)), w, std::chrono::minutes(10));
  EXPECT_LT(c.next(w), static_cast<std::uint64_t>(wall_micros(w + 1h)));  // beyond skew: ignored
  c.observe(static_cast<std::uint64_t>(wall_micros(w + 5min)), w, std::chrono::minutes(10));
  EXPECT_GT(c.next(w), static_cast<std::uint64_t>(wall_micros(w + 5min)));
}

TEST(RecordStore, ExpiresAndEnforcesCapacity) {
  RecordStore st(RecordStore::Limits{2, 2, 1 << 20});
  const auto k1 = RecordKey::from_string("k1"), k2 = RecordKey::from_string("k2"),
             k3 = RecordKey::from_string("k3");
  ASSERT_TRUE(st.put(k1, std::nullopt, body("v", 1), t0 + 1s, t0));
  ASSERT_TRUE(st.put(k2, std::nullopt, body("v", 1), t0 + 10s, t0));
  auto full = st.put(k3, std::nullopt, body("v", 1), t0 + 10s, t0);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error(), dht_errc::capacity);
  EXPECT_EQ(st.put(k3, std::nullopt, body("v", 1), t0, t0).error(), dht_errc::expired);
  // k1 expires, which makes room.
  EXPECT_EQ(st.find(k1.id(), t0 + 1s), nullptr);
  EXPECT_TRUE(st.put(k3, std::nullopt, body("v", 1), t0 + 10s, t0 + 1s));
  // Sub-key limit per key.
  EXPECT_TRUE(st.put(k2, SubKey::from_string("a"), body("x", 2), t0 + 10s, t0 + 1s));
  EXPECT_TRUE(st.put(k2, SubKey::from_string("b"), body("x", 2), t0 + 10s, t0 + 1s));
  EXPECT_EQ(st.put(k2, SubKey::from_string("c"), body("x", 2), t0 + 10s, t0 + 1s).error(),
            dht_errc::capacity);
  EXPECT_EQ(st.records(k2.id(), t0 + 1s).size(), 3u);  // plain (floor) + 2 entries
  st.expire(t0 + 11s);
  EXPECT_EQ(st.key_count(), 0u);
  EXPECT_EQ(st.total_bytes(), 0u);
}

TEST(RecordStore, ByteLimit) {
  RecordStore st(RecordStore::Limits{100, 100, 1000});
  const auto k = RecordKey::from_string("k");
  EXPECT_TRUE(st.put(k, SubKey::from_string("a"), body(std::string(500, 'x'), 1), t0 + 1s, t0));
  EXPECT_EQ(
      st.put(k, SubKey::from_string("b"), body(std::string(500, 'x'), 1), t0 + 1s, t0).error(),
      dht_errc::capacity);
  EXPECT_GT(st.total_bytes(), 500u);
}
