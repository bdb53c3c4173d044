// Replicas of one expert: requests spread over the servers declaring it, and a server whose
// call failed is avoided while another replica serves the expert.
#include <gtest/gtest.h>

#include "moe/moe_env.hpp"

namespace starling::moe {
namespace {

using namespace test;

TEST(MoeReplicaChoice, RequestsSpreadAndAFailedReplicaIsAvoided) {
  Env env;
  auto a = env.serve(0, "ffn.0.[0:2]");
  auto b = env.serve(1, "ffn.0.[0:2]");
  auto dir = env.directory(2, 60s);  // the client keeps b declared after b stops
  MoeOptions o;
  o.grid_size = {1, 2};
  o.in_features = kDim;
  o.out_features = kDim;
  o.k = 2;
  o.k_min = 1;
  o.forward_timeout = 5s;
  o.timeout_after_k_min = 1s;
  RemoteMixtureOfExperts moe(o, env.cluster->host_ptr(2), dir);
  torch::manual_seed(8);
  auto x = torch::randn({8, kDim});
  {
    torch::NoGradGuard ng;
    (void)moe->forward(x);
  }
  // One request per expert, one expert per replica.
  EXPECT_EQ(a->stats().forward_batches.load(), 1u);
  EXPECT_EQ(b->stats().forward_batches.load(), 1u);
  EXPECT_EQ(moe->stats().forward_failures, 0u);

  env.stop(b);
  torch::NoGradGuard ng;
  for (int i = 0; i < 2; ++i) (void)moe->forward(x);
  const auto failed = moe->stats().forward_failures;
  EXPECT_GE(failed, 1u);
  EXPECT_LE(failed, 2u);  // at most once per expert
  for (int i = 0; i < 3; ++i) {
    auto y = moe->forward(x);
    EXPECT_TRUE(torch::isfinite(y).all().item<bool>());
  }
  EXPECT_EQ(moe->stats().forward_failures, failed) << "the failed replica was called again";
  EXPECT_EQ(moe->stats().empty_rows, 0u);
  env.stop(a);
}

}  // namespace
}  // namespace starling::moe
