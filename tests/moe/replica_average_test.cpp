// Replica averaging (ExpertServerConfig::average_period): two servers of one uid that start
// from different parameters average them through the DHT-matched all-reduce and end up with
// identical parameters, their mean.
#include <gtest/gtest.h>

#include "moe/moe_env.hpp"

namespace starling::moe {
namespace {

using namespace test;

std::shared_ptr<ExpertServer> replica(Env& env, std::size_t node, const std::string& uid,
                                      std::uint64_t seed) {
  return env.serve_module(node, uid, make_ffn_expert(kDim, kHidden, seed), env.config, true);
}

TEST(MoeReplicaAveraging, TwoReplicasConvergeToIdenticalParameters) {
  Env env;
  env.config.average_period = 1s;
  const std::string uid = "ffn.0.0";
  auto a = replica(env, 0, uid, 1);
  auto b = replica(env, 1, uid, 2);
  auto pa = make_ffn_expert(kDim, kHidden, 1).parameters->parameters();
  auto pb = make_ffn_expert(kDim, kHidden, 2).parameters->parameters();
  ASSERT_FALSE(torch::equal(pa[0], pb[0]));
  ASSERT_TRUE(wait_for(
      [&] {
        return a->stats().replica_averages.load() >= 1 && b->stats().replica_averages.load() >= 1;
      },
      30s))
      << "failures " << a->stats().average_failures.load() << " / "
      << b->stats().average_failures.load();
  env.stop(a);
  env.stop(b);
  auto ra = a->module_of(uid)->parameters();
  auto rb = b->module_of(uid)->parameters();
  ASSERT_EQ(ra.size(), pa.size());
  for (std::size_t i = 0; i < ra.size(); ++i) {
    EXPECT_TRUE(torch::equal(ra[i], rb[i])) << "param " << i;
    EXPECT_TRUE(torch::allclose(ra[i], (pa[i] + pb[i]) / 2, 1e-6, 1e-6)) << "param " << i;
  }
}

// Replicas trained apart (only one gets gradients) while rounds run: once training stops, the
// next full round makes them identical again.
TEST(MoeReplicaAveraging, ReplicasTrainedApartAreIdenticalAfterTheNextRound) {
  Env env;
  env.config.average_period = 1s;
  const std::string uid = "ffn.0.0";
  auto a = replica(env, 0, uid, 1);
  auto b = replica(env, 1, uid, 1);
  RemoteExpert remote(env.cluster->host_ptr(2), env.address(0, uid));
  torch::manual_seed(4);
  const auto until = Clock::now() + 2500ms;  // across two or three rounds
  while (Clock::now() < until)
    remote.forward(torch::randn({4, kDim}).requires_grad_(true)).square().sum().backward();
  EXPECT_GT(a->steps_of(uid), 0u);
  EXPECT_EQ(b->steps_of(uid), 0u);
  const auto ra0 = a->stats().replica_averages.load();
  const auto rb0 = b->stats().replica_averages.load();
  // Two more rounds: the first may have snapshotted before the last step.
  ASSERT_TRUE(wait_for(
      [&] {
        return a->stats().replica_averages.load() >= ra0 + 2 &&
               b->stats().replica_averages.load() >= rb0 + 2;
      },
      30s));
  env.stop(a);
  env.stop(b);
  auto pa = a->module_of(uid)->parameters();
  auto pb = b->module_of(uid)->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << i;
}

// A replica that does not average: the other's rounds find no group, fail within their
// bound and change nothing.
TEST(MoeReplicaAveraging, ReplicaWithoutAveragingLeavesTheOtherUnchanged) {
  Env env;
  const std::string uid = "ffn.0.0";
  auto cfg = env.config;
  cfg.average_period = 1s;
  auto a = env.serve_module(0, uid, make_ffn_expert(kDim, kHidden, 1), cfg, true);
  auto b = replica(env, 1, uid, 2);  // env.config: no averaging
  ASSERT_TRUE(wait_for([&] { return a->stats().average_failures.load() >= 1; }, 20s));
  env.stop(a);
  env.stop(b);
  EXPECT_EQ(a->stats().replica_averages.load(), 0u);
  auto pa = a->module_of(uid)->parameters();
  auto p0 = make_ffn_expert(kDim, kHidden, 1).parameters->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], p0[i])) << i;
}

}  // namespace
}  // namespace starling::moe
