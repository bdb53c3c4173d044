// The lookup state machine on its own: alpha, beam, convergence, failures and slow nodes.
#include <gtest/gtest.h>

#include <algorithm>

#include "starling/crypto/keys.hpp"
#include "starling/dht/lookup.hpp"

using namespace starling;
using namespace starling::dht;

namespace {
// A synthetic network: node ids random; every node knows the `know` closest nodes to itself
// plus a few random ones (enough for greedy routing).
struct Net {
  std::vector<Contact> nodes;
  Contact make(std::mt19937_64& rng) {
    static const auto peer = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
    return Contact{peer, DhtId::random(rng), {}};
  }
  std::vector<Contact> answer(const DhtId& from, const DhtId& target, std::size_t k) const {
    // Answer like a node with complete knowledge: the k closest to target except itself.
    std::vector<Contact> v;
    for (const auto& n : nodes)
      if (n.id != from) v.push_back(n);
    std::partial_sort(
        v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(k, v.size())), v.end(),
        [&](const Contact& a, const Contact& b) { return closer(target, a.id, b.id); });
    v.resize(std::min(k, v.size()));
    return v;
  }
};
}  // namespace

TEST(Lookup, RespectsAlphaAndConvergesOnClosest) {
  std::mt19937_64 rng(1);
  Net net;
  for (int i = 0; i < 200; ++i) net.nodes.push_back(net.make(rng));
  const DhtId target = DhtId::random(rng);
  Lookup l(target, 3, 8);
  for (int i = 0; i < 8; ++i) l.add(net.nodes[static_cast<std::size_t>(i)], 1);
  std::size_t rounds = 0;
  while (!l.converged()) {
    auto batch = l.next();
    ASSERT_LE(l.in_flight(), 3u);
    ASSERT_FALSE(batch.empty());
    for (const auto& c : batch) l.on_response(c.id, net.answer(c.id, target, 8));
    ASSERT_LT(++rounds, 100u);
  }
  auto got = l.closest_responded(8);
  auto want = net.answer(DhtId{}, target, 8);
  ASSERT_EQ(got.size(), 8u);
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(got[i].id, want[i].id);
  EXPECT_TRUE(l.idle());
}

TEST(Lookup, FailuresAndSlowNodesDoNotStall) {
  std::mt19937_64 rng(2);
  Net net;
  for (int i = 0; i < 50; ++i) net.nodes.push_back(net.make(rng));
  const DhtId target = DhtId::random(rng);
  Lookup l(target, 2, 4);
  for (const auto& n : net.nodes) l.add(n, 1);
  auto first = l.next();
  ASSERT_EQ(first.size(), 2u);
  // One fails, one is slow: both free their slot.
  l.on_failure(first[0].id);
  l.on_slow(first[1].id);
  auto second = l.next();
  EXPECT_EQ(second.size(), 2u);
  EXPECT_EQ(l.in_flight(), 2u);
  // A late answer from the slow node still counts.
  l.on_response(first[1].id, {});
  EXPECT_EQ(l.find(first[1].id)->state, Lookup::State::responded);
  // Answer everything else without new peers until done.
  for (int i = 0; i < 100 && !l.converged(); ++i) {
    for (const auto& c : second) l.on_response(c.id, {});
    second = l.next();
  }
  EXPECT_TRUE(l.converged());
  EXPECT_EQ(l.closest_responded(10).size(), 4u);  // the beam
  EXPECT_EQ(l.failed(), 1u);
}

TEST(Lookup, HopsAndCandidateBound) {
  std::mt19937_64 rng(3);
  Net net;
  for (int i = 0; i < 100; ++i) net.nodes.push_back(net.make(rng));
  const DhtId target = DhtId::random(rng);
  Lookup l(target, 1, 2, /*max_candidates=*/5);
  l.add(net.nodes[0], 1);
  auto q = l.next();
  ASSERT_EQ(q.size(), 1u);
  l.on_response(q[0].id, net.answer(q[0].id, target, 20));
  // Only 5 candidates kept: the closest ones; they are hop 2.
  auto want = net.answer(q[0].id, target, 4);
  for (const auto& w : want) {
    ASSERT_NE(l.find(w.id), nullptr);
    EXPECT_EQ(l.find(w.id)->hop, 2u);
  }
  // Re-adding a known node does not change its hop.
  l.add(want[0], 7);
  EXPECT_EQ(l.find(want[0].id)->hop, 2u);
}

TEST(Lookup, DialBudgetSendsConnectedCandidatesWhileOneDialIsInFlight) {
  std::mt19937_64 rng(3);
  Net net;
  for (int i = 0; i < 6; ++i) net.nodes.push_back(net.make(rng));
  const DhtId target = DhtId::random(rng);
  auto sorted = net.nodes;
  std::sort(sorted.begin(), sorted.end(),
            [&](const Contact& a, const Contact& b) { return closer(target, a.id, b.id); });
  // The two closest need a new connection, the others are connected.
  auto connected = [&](const Contact& c) { return c.id != sorted[0].id && c.id != sorted[1].id; };
  Lookup l(target, 3, 8);
  for (const auto& c : net.nodes) l.add(c, 1);
  auto first = l.next(connected, 1);
  ASSERT_EQ(first.size(), 3u);  // the closest (a dial) and two connected ones past the second
  EXPECT_EQ(first[0].id, sorted[0].id);
  EXPECT_EQ(first[1].id, sorted[2].id);
  EXPECT_EQ(first[2].id, sorted[3].id);
  EXPECT_EQ(l.dials_in_flight(), 1u);
  // A connected answer frees an alpha slot, but the second dial still waits for the first.
  l.on_response(sorted[2].id, {});
  auto second = l.next(connected, 1);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].id, sorted[4].id);
  // The dial turns slow: its slot goes to the next dial.
  l.on_slow(sorted[0].id);
  EXPECT_EQ(l.dials_in_flight(), 0u);
  auto third = l.next(connected, 1);
  ASSERT_EQ(third.size(), 1u);
  EXPECT_EQ(third[0].id, sorted[1].id);
  // Without a budget (or without the hint) the closest go first, as before.
  Lookup plain(target, 3, 8);
  for (const auto& c : net.nodes) plain.add(c, 1);
  auto all = plain.next(connected, 0);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[1].id, sorted[1].id);
  EXPECT_EQ(plain.dials_in_flight(), 2u);
}
