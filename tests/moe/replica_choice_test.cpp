// Replicas of one expert: the choice by expected finish time (ReplicaChooser, in virtual
// time), requests spread over the servers declaring it, a slow replica gets less traffic, and
// a server whose call failed is avoided while another replica serves the expert.
#include <gtest/gtest.h>

#include "moe/moe_env.hpp"

namespace starling::moe {
namespace {

using namespace test;

// Calls of `rows` rows planned in one forward among `servers`: how many each got.
std::map<std::string, int> plan(ReplicaChooser& c, TimePoint now, int calls, std::size_t rows,
                                const std::vector<std::string>& servers) {
  c.begin(now);
  std::map<std::string, int> got;
  for (int i = 0; i < calls; ++i) ++got[servers[c.choose("e" + std::to_string(i), servers, rows)]];
  return got;
}

TEST(MoeReplicaChooser, UnmeasuredReplicasShareTheCalls) {
  ReplicaChooser c;
  auto got = plan(c, TimePoint{}, 6, 4, {"a", "b", "c"});
  EXPECT_EQ(got["a"], 2);
  EXPECT_EQ(got["b"], 2);
  EXPECT_EQ(got["c"], 2);
}

TEST(MoeReplicaChooser, FasterReplicaTakesCallsUntilItsQueueIsLonger) {
  ReplicaChooser c;
  const TimePoint t{};
  for (int i = 0; i < 5; ++i) {
    c.observe("fast", 4, 1ms, t);
    c.observe("slow", 4, 20ms, t);
  }
  auto few = plan(c, t, 10, 4, {"slow", "fast"});
  EXPECT_EQ(few["fast"], 10);
  // 40 calls: fast's queue passes 20 ms after about 20 of them, then slow takes some.
  auto many = plan(c, t, 40, 4, {"slow", "fast"});
  EXPECT_GE(many["fast"], 35);
  EXPECT_GE(many["slow"], 1);
  // An unmeasured replica is priced like the best measured one, so it is tried.
  auto fresh = plan(c, t, 2, 4, {"slow", "fast", "new"});
  EXPECT_EQ(fresh["new"], 1);
  EXPECT_EQ(fresh["fast"], 1);
}

TEST(MoeReplicaChooser, FitSeparatesLatencyFromPerRowCost) {
  ReplicaChooser c;
  for (int i = 0; i < 20; ++i) {
    c.observe("s", 1, 10ms + 1ms, TimePoint{});
    c.observe("s", 101, 10ms + 101ms, TimePoint{});
  }
  const double ms51 = std::chrono::duration<double, std::milli>(c.expected("s", 51)).count();
  const double ms1001 = std::chrono::duration<double, std::milli>(c.expected("s", 1001)).count();
  EXPECT_NEAR(ms51, 61.0, 1.0);
  EXPECT_NEAR(ms1001, 1011.0, 5.0);
}

TEST(MoeReplicaChooser, FailedReplicaIsAvoidedAndMeasurementsAreForgotten) {
  ReplicaChoiceOptions o;
  o.avoid_failed = 10s;
  o.forget_after = 60s;
  ReplicaChooser c(o);
  const TimePoint t0{};
  c.observe("a", 4, 1ms, t0);
  c.observe("b", 4, 50ms, t0);
  c.failed("u", "a", t0);
  c.begin(t0 + 1s);
  const std::vector<std::string> ab{"a", "b"};
  EXPECT_EQ(c.choose("u", ab, 4), 1u) << "the failed replica was chosen";
  EXPECT_EQ(c.choose("v", ab, 4), 1u) << "a server that failed another expert was chosen";
  EXPECT_EQ(c.choose("v", std::vector<std::string>{"a"}, 4), 0u);
  c.begin(t0 + 10s);
  EXPECT_EQ(c.choose("u", ab, 4), 0u) << "still avoided when avoid_failed has passed";
  EXPECT_EQ(c.choose("u", std::vector<std::string>{"a"}, 4), 0u);
  EXPECT_TRUE(c.measured("b"));
  c.begin(t0 + 61s);
  EXPECT_FALSE(c.measured("b")) << "a slow replica is never tried again";
}

TEST(MoeReplicaChoice, SlowReplicaGetsLessTraffic) {
  Env env;
  auto fast = env.serve(0, "ffn.0.[0:2]");
  auto slow = env.serve(1, "ffn.0.[0:2]", 100ms);  // 100 ms per batch on its runtime thread
  auto dir = env.directory(2, 60s);
  RemoteMixtureOfExperts moe(mixture_options({1, 2}, 2, 2, 10s, 5s), env.cluster->host_ptr(2), dir);
  torch::manual_seed(8);
  auto x = torch::randn({8, kDim});
  torch::NoGradGuard ng;
  for (int i = 0; i < 20; ++i) (void)moe->forward(x);
  EXPECT_EQ(moe->stats().forward_failures, 0u);
  EXPECT_EQ(moe->stats().forward_late, 0u);
  const auto f = fast->stats().forward_rows.load();
  const auto s = slow->stats().forward_rows.load();
  EXPECT_EQ(f + s, 20u * 2u * 8u);
  EXPECT_LT(4 * s, f + s) << "the slow replica got " << s << " of " << f + s << " rows";
  env.stop(fast);
  env.stop(slow);
}

TEST(MoeReplicaChoice, ReplicasAreTriedAndAFailedCallGoesToAnotherReplica) {
  Env env;
  auto a = env.serve(0, "ffn.0.0", 100ms);  // slower than b while b lives
  auto b = env.serve(1, "ffn.0.0");
  auto dir = env.directory(2, 60s);  // the client keeps b declared after b stops
  RemoteMixtureOfExperts moe(mixture_options({1, 1}, 1, 1, 5s, 5s), env.cluster->host_ptr(2), dir);
  torch::manual_seed(8);
  auto x = torch::randn({8, kDim});
  torch::NoGradGuard ng;
  // Neither is measured: the first two forwards try one each.
  for (int i = 0; i < 2; ++i) (void)moe->forward(x);
  EXPECT_EQ(a->stats().forward_batches.load(), 1u);
  EXPECT_EQ(b->stats().forward_batches.load(), 1u);
  // Then the faster one takes them.
  for (int i = 0; i < 3; ++i) (void)moe->forward(x);
  EXPECT_EQ(b->stats().forward_batches.load(), 4u);
  EXPECT_EQ(moe->stats().forward_failures, 0u);

  env.stop(b);
  // The next forward goes to b, fails, and is sent again to a within the same forward.
  auto y = moe->forward(x);
  EXPECT_EQ(moe->stats().forward_failures, 1u);
  EXPECT_EQ(moe->stats().forward_retries, 1u);
  EXPECT_EQ(moe->stats().empty_rows, 0u);
  EXPECT_EQ(a->stats().forward_batches.load(), 2u);
  for (int i = 0; i < 3; ++i) {
    y = moe->forward(x);
    EXPECT_TRUE(torch::isfinite(y).all().item<bool>());
  }
  EXPECT_EQ(moe->stats().forward_failures, 1u) << "the failed replica was called again";
  EXPECT_EQ(a->stats().forward_batches.load(), 5u);
  env.stop(a);
}

}  // namespace
}  // namespace starling::moe
