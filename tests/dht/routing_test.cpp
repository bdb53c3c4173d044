// Routing table: splitting (classic and relaxed), replacement cache, eviction decided by the
// ping of the least-recently-seen node, failures, closest-node queries and refresh.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "starling/crypto/keys.hpp"
#include "starling/dht/routing_table.hpp"

using namespace starling;
using namespace starling::dht;

namespace {
const TimePoint t0 = TimePoint{} + std::chrono::hours(1);

// A contact whose node id is chosen freely (the table never re-derives ids).
Contact with_id(const DhtId& id) {
  static int n = 0;
  auto peer = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
  return Contact{peer, id, {to_bytes("addr" + std::to_string(++n))}};
}

// An id sharing exactly `cpl` leading bits with `self`, the rest random.
DhtId at_distance(const DhtId& self, std::size_t cpl, std::mt19937_64& rng) {
  DhtId r = DhtId::random_with_prefix(self, cpl + 1, rng);
  return r.with_bit(cpl, !self.bit(cpl));
}

RoutingTable::Options opts(std::size_t k, std::size_t modulo) {
  return RoutingTable::Options{k, modulo, k, 3};
}

void check_partition(const RoutingTable& t) {
  // Buckets are sorted, disjoint, cover the whole space, and hold only ids they cover.
  std::size_t total = 0;
  for (std::size_t i = 0; i < t.buckets().size(); ++i) {
    const auto& b = t.buckets()[i];
    for (const auto& n : b.nodes) EXPECT_TRUE(b.covers(n.contact.id));
    EXPECT_LE(b.nodes.size(), t.options().k);
    total += b.nodes.size();
    if (i > 0) {
      EXPECT_LT(t.buckets()[i - 1].prefix, b.prefix);
    }
  }
  EXPECT_EQ(total, t.size());
  // Sum of 2^-depth over buckets == 1 (the ranges partition the space).
  long double cover = 0;
  for (const auto& b : t.buckets()) cover += std::ldexp(1.0L, -static_cast<int>(b.depth));
  EXPECT_NEAR(static_cast<double>(cover), 1.0, 1e-12);
}
}  // namespace

TEST(RoutingTable, ClassicSplitOnlyAlongOwnId) {
  std::mt19937_64 rng(3);
  const DhtId self = DhtId::random(rng);
  RoutingTable t(self, opts(4, 0), t0);
  // 4 far nodes (cpl 0) fill the root; a fifth splits it (root covers self).
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(t.on_seen(with_id(at_distance(self, 0, rng)), t0));
  EXPECT_EQ(t.buckets().size(), 1u);
  EXPECT_FALSE(t.on_seen(with_id(at_distance(self, 3, rng)), t0));
  EXPECT_GE(t.buckets().size(), 2u);
  // More far nodes: their bucket (depth 1, not covering self) must not split; a ping of its
  // least-recently-seen node is requested instead.
  auto ping = t.on_seen(with_id(at_distance(self, 0, rng)), t0 + 1s);
  ASSERT_TRUE(ping);
  EXPECT_EQ(ping->node.id.common_prefix_length(self), 0u);
  // Fill close buckets: the table keeps splitting along self.
  for (std::size_t cpl = 1; cpl < 12; ++cpl)
    for (int i = 0; i < 4; ++i) t.on_seen(with_id(at_distance(self, cpl, rng)), t0);
  check_partition(t);
  for (const auto& b : t.buckets()) {
    if (b.covers(self)) continue;
    // Classic rule: every bucket off our own path is a sibling of it (depth = its cpl + 1).
    EXPECT_EQ(b.depth, b.prefix.common_prefix_length(self) + 1);
  }
}

TEST(RoutingTable, RelaxedSplitKeepsMoreFarNodes) {
  std::mt19937_64 rng(4);
  const DhtId self = DhtId::random(rng);
  RoutingTable classic(self, opts(4, 0), t0), relaxed(self, opts(4, 5), t0);
  std::vector<Contact> far;
  for (int i = 0; i < 200; ++i) far.push_back(with_id(at_distance(self, 0, rng)));
  for (const auto& c : far) {
    classic.on_seen(c, t0);
    relaxed.on_seen(c, t0);
  }
  check_partition(classic);
  check_partition(relaxed);
  // The far half: classic keeps one bucket (4 nodes); relaxed splits it down to depth 5
  // (16 buckets of 4).
  EXPECT_EQ(classic.size(), 4u);
  EXPECT_EQ(relaxed.size(), 64u);
  for (const auto& b : relaxed.buckets())
    if (!b.covers(self)) {
      EXPECT_LE(b.depth, 5u);
    }
}

TEST(RoutingTable, EvictionOnlyWhenPingFails) {
  std::mt19937_64 rng(5);
  const DhtId self = DhtId::random(rng);
  RoutingTable t(self, opts(3, 0), t0);
  // Bucket for cpl 0 (after the root splits because of one close node).
  t.on_seen(with_id(at_distance(self, 10, rng)), t0);
  std::vector<Contact> far;
  for (int i = 0; i < 3; ++i) {
    far.push_back(with_id(at_distance(self, 0, rng)));
    ASSERT_FALSE(t.on_seen(far.back(), t0 + std::chrono::seconds(i)));
  }
  // The bucket is full. A newcomer goes to the replacement cache and the LRS (far[0]) is pinged.
  const Contact newcomer = with_id(at_distance(self, 0, rng));
  auto ping = t.on_seen(newcomer, t0 + 10s);
  ASSERT_TRUE(ping);
  EXPECT_EQ(ping->node.id, far[0].id);
  EXPECT_FALSE(t.contains(newcomer.id));
  // Only one ping per bucket at a time.
  EXPECT_FALSE(t.on_seen(with_id(at_distance(self, 0, rng)), t0 + 11s));
  // The LRS answers: it stays (now most recently seen); the newcomer is not inserted.
  t.on_ping_result(far[0].id, true, t0 + 12s);
  EXPECT_TRUE(t.contains(far[0].id));
  EXPECT_FALSE(t.contains(newcomer.id));
  // Next newcomer: LRS is now far[1]; it does not answer -> evicted, freshest replacement in.
  const Contact newcomer2 = with_id(at_distance(self, 0, rng));
  ping = t.on_seen(newcomer2, t0 + 20s);
  ASSERT_TRUE(ping);
  EXPECT_EQ(ping->node.id, far[1].id);
  t.on_ping_result(far[1].id, false, t0 + 21s);
  EXPECT_FALSE(t.contains(far[1].id));
  EXPECT_TRUE(t.contains(newcomer2.id));
  EXPECT_FALSE(t.contains(newcomer.id));  // older replacement still waiting
  check_partition(t);
}

TEST(RoutingTable, FailuresDropNodesWhenReplacementsWait) {
  std::mt19937_64 rng(6);
  const DhtId self = DhtId::random(rng);
  RoutingTable t(self, opts(2, 0), t0);
  t.on_seen(with_id(at_distance(self, 10, rng)), t0);
  const Contact a = with_id(at_distance(self, 0, rng)), b = with_id(at_distance(self, 0, rng));
  t.on_seen(a, t0);
  t.on_seen(b, t0);
  // No replacement waiting: a node survives max_failures - 1 failures.
  EXPECT_FALSE(t.on_failure(a.id));
  EXPECT_FALSE(t.on_failure(a.id));
  EXPECT_TRUE(t.contains(a.id));
  EXPECT_TRUE(t.on_failure(a.id));  // third in a row
  EXPECT_FALSE(t.contains(a.id));
  // With a replacement waiting, one failure suffices and the replacement moves in.
  t.on_seen(a, t0 + 1s);
  const Contact c = with_id(at_distance(self, 0, rng));
  ASSERT_TRUE(t.on_seen(c, t0 + 2s));  // full: c cached, ping requested
  EXPECT_TRUE(t.on_failure(b.id));
  EXPECT_TRUE(t.contains(c.id));
  // An answer resets the failure count.
  t.on_failure(a.id);
  t.on_seen(a, t0 + 3s);
  EXPECT_EQ(t.find(a.id)->failures, 0u);
}

TEST(RoutingTable, ClosestMatchesBruteForce) {
  std::mt19937_64 rng(7);
  const DhtId self = DhtId::random(rng);
  RoutingTable t(self, opts(8, 5), t0);
  std::vector<Contact> all;
  for (int i = 0; i < 600; ++i) {
    all.push_back(with_id(DhtId::random(rng)));
    t.on_seen(all.back(), t0);
  }
  check_partition(t);
  std::vector<DhtId> held;
  for (const auto& b : t.buckets())
    for (const auto& n : b.nodes) held.push_back(n.contact.id);
  for (int q = 0; q < 50; ++q) {
    const DhtId target = DhtId::random(rng);
    auto got = t.closest(target, 20, held.front());
    std::vector<DhtId> want;
    for (const auto& id : held)
      if (id != held.front()) want.push_back(id);
    std::sort(want.begin(), want.end(),
              [&](const DhtId& a, const DhtId& b) { return closer(target, a, b); });
    want.resize(20);
    ASSERT_EQ(got.size(), 20u);
    for (std::size_t i = 0; i < 20; ++i) EXPECT_EQ(got[i].id, want[i]);
  }
}

TEST(RoutingTable, RefreshTargetsUntouchedBuckets) {
  std::mt19937_64 rng(8);
  const DhtId self = DhtId::random(rng);
  RoutingTable t(self, opts(2, 0), t0);
  std::vector<Contact> by_cpl;
  for (std::size_t cpl = 0; cpl < 6; ++cpl)
    for (int i = 0; i < 2; ++i) {
      by_cpl.push_back(with_id(at_distance(self, cpl, rng)));
      t.on_seen(by_cpl.back(), t0);
    }
  EXPECT_TRUE(t.refresh_targets(t0 + 5min, 10min, rng).empty());
  // A lookup inside bucket cpl=0 keeps it fresh, and so does traffic with a node of cpl=1.
  t.touch(at_distance(self, 0, rng), t0 + 8min);
  t.on_seen(by_cpl[2], t0 + 9min);
  auto targets = t.refresh_targets(t0 + 11min, 10min, rng);
  EXPECT_EQ(targets.size(), t.buckets().size() - 2);
  for (const auto& id : targets) {
    EXPECT_NE(id.common_prefix_length(self), 0u);
    EXPECT_NE(id.common_prefix_length(self), 1u);
  }
  // Each target lies in a distinct bucket.
  std::set<std::size_t> depths;
  for (const auto& id : targets) depths.insert(id.common_prefix_length(self));
  EXPECT_EQ(depths.size(), targets.size());
  EXPECT_TRUE(t.refresh_targets(t0 + 12min, 10min, rng).empty());
}

TEST(RoutingTable, IgnoresSelf) {
  std::mt19937_64 rng(9);
  const DhtId self = DhtId::random(rng);
  RoutingTable t(self, opts(2, 0), t0);
  EXPECT_FALSE(t.on_seen(with_id(self), t0));
  EXPECT_EQ(t.size(), 0u);
}

TEST(RoutingTable, HasRoomPredictsWhetherOnSeenAdmits) {
  // has_room(id) must say exactly whether on_seen would put the node into the table (with the
  // splits the rules allow) rather than into a replacement cache.
  for (std::size_t modulo : {0u, 5u}) {
    std::mt19937_64 rng(11 + modulo);
    const DhtId self = DhtId::random(rng);
    RoutingTable t(self, opts(3, modulo), t0);
    std::size_t admitted = 0, refused = 0;
    for (int i = 0; i < 400; ++i) {
      const auto c = with_id(at_distance(self, rng() % 10, rng));
      RoutingTable copy = t;
      const bool room = t.has_room(c.id);
      copy.on_seen(c, t0);
      EXPECT_EQ(room, copy.contains(c.id)) << "modulo " << modulo << " node " << i;
      (room ? admitted : refused)++;
      t = std::move(copy);
      EXPECT_FALSE(t.has_room(c.id));  // in the table now, or its bucket is full
    }
    EXPECT_GT(admitted, 20u);
    EXPECT_GT(refused, 20u);
    EXPECT_FALSE(t.has_room(self));
  }
}
