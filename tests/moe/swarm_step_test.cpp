// SWARM-style delayed expert steps: gradients accumulate over backward batches until a target
// number of rows (or a time bound), then one optimizer step applies their sum; a gradient
// whose forward is past the staleness bound is refused.
#include <gtest/gtest.h>

#include <thread>

#include "moe/moe_env.hpp"
#include "support/temp_dir.hpp"

namespace starling::moe {
namespace {

using namespace test;

TEST(MoeSwarmSteps, AccumulatesGradientsAndStepsAfterTargetSamples) {
  Env env;
  env.config.step_samples = 12;  // three backward calls of 4 rows
  const std::string uid = "ffn.0.0";
  auto server = env.serve(1, uid);
  auto local = make_ffn_expert(kDim, kHidden, seed_of(uid));
  torch::optim::SGD opt(local.parameters->parameters(), torch::optim::SGDOptions(kLr));
  RemoteExpert remote(env.cluster->host_ptr(2), env.address(1, uid));
  torch::manual_seed(5);
  for (int i = 0; i < 4; ++i) {
    // The local module's parameter gradients accumulate over the calls, as the server's do.
    expect_remote_matches_local(remote, local, torch::randn({4, kDim}), torch::randn({4, kDim}));
    if (i == 2) {  // 12 rows: one step on the sum of the three gradients
      opt.step();
      opt.zero_grad();
    }
    EXPECT_EQ(server->stats().optimizer_steps.load(), i < 2 ? 0u : 1u) << "after call " << i;
    EXPECT_EQ(server->steps_of(uid), i < 2 ? 0u : 1u);
    expect_params_close(*server->module_of(uid), *local.parameters, "after a call");
  }
  EXPECT_EQ(server->stats().backward_rows.load(), 16u);
  env.stop(server);
}

TEST(MoeSwarmSteps, StopAppliesAccumulatedGradientsBeforeTheFinalCheckpoint) {
  starling::test::TempDir dir("moe-final-step");
  Env env;
  env.config.step_samples = 1000;  // never reached: the gradients wait for stop()
  env.config.checkpoint_dir = dir.path;
  const std::string uid = "ffn.0.0";
  auto server = env.serve(1, uid);
  auto local = make_ffn_expert(kDim, kHidden, seed_of(uid));
  RemoteExpert remote(env.cluster->host_ptr(2), env.address(1, uid));
  torch::manual_seed(6);
  for (int i = 0; i < 2; ++i)
    expect_remote_matches_local(remote, local, torch::randn({4, kDim}), torch::randn({4, kDim}));
  EXPECT_EQ(server->steps_of(uid), 0u);
  env.stop(server);
  EXPECT_EQ(server->stats().final_steps.load(), 1u);
  EXPECT_EQ(server->steps_of(uid), 1u);
  torch::optim::SGD opt(local.parameters->parameters(), torch::optim::SGDOptions(kLr));
  opt.step();  // one step on the sum of both gradients
  expect_params_close(*server->module_of(uid), *local.parameters, "after stop");

  // The final checkpoint holds that step.
  auto again = ExpertServer::create(env.cluster->host_ptr(0), nullptr, env.config);
  ASSERT_TRUE(again->add_expert(uid, make_ffn_expert(kDim, kHidden, 1), sgd_factory(kLr)));
  EXPECT_EQ(again->steps_of(uid), 1u);
  expect_params_close(*again->module_of(uid), *local.parameters, "restored");
}

TEST(MoeSwarmSteps, TimeBoundStepsAccumulatedGradients) {
  Env env;
  env.config.step_samples = 1000;
  env.config.max_step_delay = 1s;
  const std::string uid = "ffn.0.0";
  auto server = env.serve(1, uid);
  RemoteExpert remote(env.cluster->host_ptr(2), env.address(1, uid));
  const auto t0 = Clock::now();
  remote.forward(torch::randn({4, kDim}).requires_grad_(true)).sum().backward();
  if (Clock::now() - t0 < 1s) {
    EXPECT_EQ(server->stats().optimizer_steps.load(), 0u);
  }
  ASSERT_TRUE(wait_for([&] { return server->stats().optimizer_steps.load() >= 1; }))
      << "the accumulated gradient was never applied";
  EXPECT_GE(Clock::now() - t0, 1s);
  EXPECT_EQ(server->steps_of(uid), 1u);
  env.stop(server);
}

TEST(MoeSwarmSteps, GradientPastTheStalenessBoundIsRefused) {
  Env env;
  env.config.max_staleness = 1;  // Learning@home steps (one per backward batch)
  const std::string uid = "ffn.0.0";
  auto server = env.serve(1, uid);
  RemoteExpert a(env.cluster->host_ptr(2), env.address(1, uid));
  RemoteExpert b(env.cluster->host_ptr(0), env.address(1, uid));
  auto step_b = [&] { b.forward(torch::randn({2, kDim}).requires_grad_(true)).sum().backward(); };

  // Forward at step 0, two steps by another client, backward: 2 steps stale.
  auto x = torch::randn({3, kDim}).requires_grad_(true);
  auto y = a.forward(x);
  step_b();
  step_b();
  try {
    y.sum().backward();
    ADD_FAILURE() << "a gradient 2 steps stale was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("stale"), std::string::npos) << e.what();
  }
  EXPECT_EQ(server->stats().stale_gradients.load(), 1u);
  EXPECT_EQ(server->steps_of(uid), 2u);

  // One step stale is within the bound.
  auto x2 = torch::randn({3, kDim}).requires_grad_(true);
  auto y2 = a.forward(x2);
  step_b();
  y2.sum().backward();
  EXPECT_TRUE(x2.grad().defined());
  EXPECT_EQ(server->steps_of(uid), 4u);

  // A client that does not send its forward's step is not checked.
  TensorData in{{1, kDim}, std::vector<float>(kDim, 0.5f)};
  TensorData grad{{1, kDim}, std::vector<float>(kDim, 0.1f)};
  auto host = env.cluster->host_ptr(2);
  auto to = env.address(1, uid);
  auto r = block_on(
      env.io.executor(), [&] { return call_backward(*host, to, in, grad, ExpertCallOptions{}); },
      10s);
  EXPECT_TRUE(r) << r.error().message();
  EXPECT_EQ(server->stats().stale_gradients.load(), 1u);
  env.stop(server);
}

TEST(MoeSwarmSteps, MixtureSendsItsForwardStepsWithTheBackward) {
  Env env;
  env.config.max_staleness = 0;
  const std::string uid = "ffn.0.0";
  auto server = env.serve(1, uid);
  RemoteMixtureOfExperts moe(mixture_options({1, 1}, 1, 1, 5s, 1s), env.cluster->host_ptr(2),
                             env.directory(2));
  RemoteExpert other(env.cluster->host_ptr(0), env.address(1, uid));
  auto x = torch::randn({4, kDim}).requires_grad_(true);
  moe->forward(x).sum().backward();  // staleness 0: applied
  EXPECT_EQ(moe->stats().backward_failures, 0u);
  EXPECT_EQ(server->steps_of(uid), 1u);
  auto y = moe->forward(x);
  other.forward(torch::randn({2, kDim}).requires_grad_(true)).sum().backward();  // a step between
  y.sum().backward();
  EXPECT_EQ(moe->stats().backward_failures, 1u);
  EXPECT_EQ(server->stats().stale_gradients.load(), 1u);
  EXPECT_EQ(server->steps_of(uid), 2u);
  env.stop(server);
}

}  // namespace
}  // namespace starling::moe
