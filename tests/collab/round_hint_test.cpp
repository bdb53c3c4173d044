// The "every expected peer joined" hint over the network: RoundOptions::expected_group reaches
// the matchmaking leader through NetCollaboration (StepOptions::expected_group_size), which
// then begins at once instead of after min_wait. Three nodes on loopback whose leader would
// otherwise wait min_wait (30 s here, longer than the matchmaking window) and so begin only at
// the window's end (10 s).
#include <gtest/gtest.h>

#include <thread>

#include "support/crashable_node.hpp"
#include "support/round_data.hpp"

using namespace starling;
using namespace starling::training;

namespace {

using Collab = std::shared_ptr<collab::NetCollaboration>;

constexpr std::size_t kN = 3, kW = 1000;
// The round's deadline: matchmaking gets half of it (NetCollaboration::step_options).
constexpr Duration kRound = 20s;

struct Nodes {
  std::vector<std::unique_ptr<test::CrashableNode>> nodes;
  Nodes() {
    auto cfg = test::loopback_config(test::loopback_options("hint", 8));
    cfg.matchmaking.min_wait = 30s;  // never reached: the window ends first
    nodes.push_back(test::CrashableNode::start({}, cfg));
    const auto seed = nodes[0]->listen_addresses();
    for (std::size_t i = 1; i < kN; ++i) nodes.push_back(test::CrashableNode::start(seed, cfg));
  }
};

struct Outcome {
  result<RoundResult> r = make_error(errc::internal, "not run");
  std::vector<float> w;
};

awaitable<result<RoundResult>> average_on(Collab c, std::shared_ptr<Outcome> out, RoundOptions o) {
  auto d = test::round_data({{"w", out->w}});
  auto r = co_await c->average(d, o);
  if (r) test::split(d, {out->w});
  co_return r;
}

// Every node averages `key` at once (node i: values i + 1, weight 1), with `expected_group`.
std::vector<Outcome> average_all(const Nodes& n, const std::string& key,
                                 std::size_t expected_group) {
  std::vector<std::shared_ptr<Outcome>> outs;
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < kN; ++i) {
    auto out = std::make_shared<Outcome>();
    out->w.assign(kW, static_cast<float>(i + 1));
    outs.push_back(out);
    RoundOptions o;
    o.key = key;
    o.weight = 1;
    o.deadline = Clock::now() + kRound;
    o.expected_members = kN;
    o.expected_group = expected_group;
    threads.emplace_back([c = n.nodes[i]->collaboration(), out, o] {
      out->r = block_on(
          c->executor(), [c, out, o] { return average_on(c, out, o); }, kRound + 30s);
    });
  }
  for (auto& th : threads) th.join();
  std::vector<Outcome> v;
  for (auto& o : outs) v.push_back(std::move(*o));
  return v;
}

// Every node averaged with all three; returns the longest matchmaking time.
Duration expect_all_three(const std::vector<Outcome>& outs) {
  Duration longest{0};
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i].r) {
      ADD_FAILURE() << "node " << i << ": " << outs[i].r.error().message();
      continue;
    }
    EXPECT_EQ(outs[i].r.value().members.size(), kN) << "node " << i;
    for (float x : outs[i].w) EXPECT_NEAR(x, 2.0f, 1e-5f);
    longest = std::max(longest, outs[i].r.value().matchmaking_time);
  }
  return longest;
}

}  // namespace

TEST(RoundHint, LeaderBeginsOnceEveryExpectedPeerJoined) {
  Nodes n;
  // With the hint the group begins as soon as the three are in: well within the first half
  // of the 10 s window (settle 0.3 s and a few DHT reads on loopback).
  for (int round = 0; round < 2; ++round) {
    const auto longest = expect_all_three(average_all(n, "grads/" + std::to_string(round), kN));
    EXPECT_LT(longest, kRound / 4) << "round " << round << ": the leader waited";
  }
}

// The control: without the hint (or with one above the peers there) the leader holds the group
// until the window's end; the test above can therefore fail.
TEST(RoundHint, WithoutTheHintTheLeaderWaitsForTheWindow) {
  Nodes n;
  EXPECT_GE(expect_all_three(average_all(n, "grads/0", 0)), kRound / 4);
  EXPECT_GE(expect_all_three(average_all(n, "grads/1", kN + 1)), kRound / 4);
}
