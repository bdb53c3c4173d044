// The Switch variant: top-1 routing through the DHT with a residual output, the
// load-balancing loss evening out a gating that starts on one expert, and the residual path
// when every expert is gone.
#include <gtest/gtest.h>

#include "moe/moe_env.hpp"
#include "starling/moe/switch.hpp"

namespace starling::moe {
namespace {

using namespace test;

SwitchOptions switch_options(std::int64_t experts) {
  SwitchOptions o;
  o.moe.grid_size = {experts};
  o.moe.in_features = kDim;
  o.moe.out_features = kDim;
  o.moe.forward_timeout = 5s;
  o.moe.backward_timeout = 5s;
  o.moe.timeout_after_k_min = 1s;
  return o;
}

// Share of the answered samples of the last forward routed to each of `n` experts.
std::vector<double> shares(RemoteSwitchMixtureOfExperts& s, std::int64_t n) {
  auto coord = s->moe->last_coords.select(1, 0).select(1, 0);
  auto answered = s->moe->last_answered.select(1, 0);
  auto c = coord.masked_select(answered);
  std::vector<double> out(static_cast<std::size_t>(n), 0);
  for (std::int64_t i = 0; i < c.size(0); ++i) out[c[i].item<std::int64_t>()] += 1;
  for (auto& v : out) v /= std::max<double>(1, static_cast<double>(c.size(0)));
  return out;
}

TEST(MoeSwitch, BalancingLossSpreadsSamplesOverFiveExperts) {
  Env env;
  auto server = env.serve(1, "ffn.[0:5]");
  auto o = switch_options(5);
  o.utilisation_alpha = 0.5;
  torch::manual_seed(2);
  RemoteSwitchMixtureOfExperts s(o, env.cluster->host_ptr(2), env.directory(2));
  {
    torch::NoGradGuard ng;
    s->moe->proj->bias.copy_(torch::tensor({3.0f, 0.0f, 0.0f, 0.0f, 0.0f}));
  }
  torch::optim::SGD opt(s->parameters(), torch::optim::SGDOptions(5.0));
  auto x = torch::randn({100, kDim});
  std::vector<double> first;
  for (int step = 0; step < 10; ++step) {
    opt.zero_grad();
    auto r = s->forward(x);
    if (step == 0) first = shares(s, 5);
    r.balancing_loss.backward();
    opt.step();
  }
  EXPECT_GT(first[0], 0.5) << "the gating did not start on expert 0";
  (void)s->forward(x);
  auto last = shares(s, 5);
  for (std::size_t e = 0; e < last.size(); ++e)
    EXPECT_GT(last[e], 0.1) << "expert " << e << " share " << last[e];
  std::printf(
      "switch shares before: %.2f %.2f %.2f %.2f %.2f, after 10 steps: %.2f %.2f %.2f %.2f %.2f\n",
      first[0], first[1], first[2], first[3], first[4], last[0], last[1], last[2], last[3],
      last[4]);
  env.stop(server);
}

TEST(MoeSwitch, OutputIsResidualPlusGatedExpertAndGatingGetsGradients) {
  Env env;
  auto server = env.serve(1, "ffn.[0:2].[0:2]");
  auto o = switch_options(2);
  o.moe.grid_size = {2, 2};
  RemoteSwitchMixtureOfExperts s(o, env.cluster->host_ptr(2), env.directory(2));
  torch::manual_seed(4);
  auto x = torch::randn({6, kDim}).requires_grad_(true);
  auto r = s->forward(x);
  ASSERT_EQ(r.output.sizes(), x.sizes());
  // Row 0 by hand: x + p * expert(x) with the expert it was routed to.
  auto c = s->moe->last_coords[0][0];
  const std::string uid = "ffn." + std::to_string(c[0].item<std::int64_t>()) + "." +
                          std::to_string(c[1].item<std::int64_t>());
  auto local = make_ffn_expert(kDim, kHidden, seed_of(uid));
  {
    torch::NoGradGuard ng;
    auto logits = s->moe->proj->forward(x.narrow(0, 0, 1));
    auto p0 = torch::softmax(logits.narrow(1, 0, 2), 1)[0][c[0].item<std::int64_t>()];
    auto p1 = torch::softmax(logits.narrow(1, 2, 2), 1)[0][c[1].item<std::int64_t>()];
    auto want = x[0] + p0 * p1 * local.forward(x.narrow(0, 0, 1))[0];
    EXPECT_TRUE(torch::allclose(r.output[0], want, 1e-5, 1e-5));
  }
  (r.output.sum() + r.balancing_loss).backward();
  ASSERT_TRUE(s->moe->proj->weight.grad().defined());
  EXPECT_GT(s->moe->proj->weight.grad().abs().sum().item<double>(), 0);
  ASSERT_TRUE(x.grad().defined());
  env.stop(server);
}

TEST(MoeSwitch, EveryExpertGoneLeavesTheResidualWithinTheDeadline) {
  Env env;
  auto server = env.serve(1, "ffn.[0:2]");
  auto o = switch_options(2);
  RemoteSwitchMixtureOfExperts s(o, env.cluster->host_ptr(2), env.directory(2));
  auto x = torch::randn({4, kDim});
  (void)s->forward(x);  // finds and caches the experts
  env.stop(server);     // its declarations stay in the DHT: the calls fail
  const auto t0 = Clock::now();
  auto r = s->forward(x);
  EXPECT_LT(Clock::now() - t0, o.moe.forward_timeout + 1s);
  EXPECT_TRUE(torch::equal(r.output, x));
  EXPECT_EQ(s->residual_only(), 1u);
}

}  // namespace
}  // namespace starling::moe
