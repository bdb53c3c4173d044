// DelayCorrection::local: while a round is in flight, a peer computes gradients at the
// collaboration's parameters stepped by its own contribution (a preview that changes neither
// them nor the optimizer state); when the round ends the collaboration's average replaces
// that step. Reference: Adam steps computed here on the same small model.
#include <gtest/gtest.h>

#include <torch/optim/adam.h>

#include "optim/gated_peer.hpp"

using namespace starling;
using namespace starling::optim;
using namespace starling::training;

using test::digest_of;
using test::flat_params;
using test::GatedPeer;
using test::make_linear;
using test::mean_gradient;
using test::wait_until;

namespace {

constexpr double kLr = 0.05;

std::unique_ptr<torch::optim::Optimizer> adam(torch::nn::Linear& m) {
  return std::make_unique<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(kLr));
}

// make_linear(1)'s parameters after Adam steps (lr kLr) with `grads` (flat: weight, bias) in
// order, from one optimizer state.
torch::Tensor adam_path(const std::vector<torch::Tensor>& grads) {
  auto m = make_linear(1);
  torch::optim::Adam opt(m->parameters(), torch::optim::AdamOptions(kLr));
  for (const auto& g : grads) {
    m->weight.mutable_grad() = g.narrow(0, 0, 4).view({1, 4}).clone();
    m->bias.mutable_grad() = g.narrow(0, 4, 1).clone();
    opt.step();
  }
  return flat_params(*m);
}

}  // namespace

TEST(DelayedUpdates, LocalStepComputesGradientsAfterTheOwnStepAndTheAverageReplacesIt) {
  GatedPeer p(DelayCorrection::local, {}, adam);
  // The imaginary partner's contribution: the average differs from this peer's own gradient.
  const auto partner = torch::tensor({0.3f, -0.2f, 0.1f, 0.4f, -0.5f});
  p.collab->partner_values.assign(partner.data_ptr<float>(), partner.data_ptr<float>() + 5);
  ASSERT_TRUE(wait_until([&] { return p.knows_partner(); }, 30s));
  const auto p0 = flat_params(*p.model);
  for (int i = 0; i < 8; ++i) p.feed();  // the round of epoch 0 starts
  ASSERT_TRUE(wait_until([&] { return p.collab->started == 1; }, 30s));
  const auto own0 = mean_gradient(p, 0, 8);
  const auto local1 = adam_path({own0});
  EXPECT_TRUE(torch::allclose(flat_params(*p.model), local1, 1e-5, 1e-6))
      << "the model holds master after a local step with the own gradient";
  for (int i = 0; i < 3; ++i) p.feed();
  // The collaboration's state at epoch 0 is still p0.
  torch::Tensor seen;
  p.opt->with_collaboration_parameters([&] { seen = flat_params(*p.model); });
  EXPECT_TRUE(torch::equal(seen, p0));
  EXPECT_EQ(p.opt->state_digest(), digest_of(p0));
  EXPECT_TRUE(torch::allclose(flat_params(*p.model), local1, 1e-5, 1e-6));

  p.collab->open();
  ASSERT_TRUE(wait_until([&] { return p.collab->finished == 1; }, 30s));
  const auto [first_applied, second_launch] = p.feed_until_second_round();
  ASSERT_GT(first_applied, 8u);
  ASSERT_GT(second_launch, first_applied);
  // Step 1 applied the average (not the own gradient) to p0 with the optimizer state of p0: a
  // local step that leaked into master or into Adam's moments would show here.
  const auto avg0 = (own0 + partner) / 2;
  const auto p1 = adam_path({avg0});
  for (std::size_t i = 8; i < first_applied; ++i)
    EXPECT_TRUE(torch::allclose(p.params_at[i], local1, 1e-5, 1e-6)) << "batch " << i;
  for (std::size_t i = first_applied; i < second_launch; ++i)
    EXPECT_TRUE(torch::allclose(p.params_at[i], p1, 1e-5, 1e-6)) << "batch " << i;
  // Round 1 carries batches 8.. (taken at local1, then p1); the model now holds p1 after a local
  // step with their mean gradient, from the optimizer state after step 1.
  const auto own1 = mean_gradient(p, 8, second_launch);
  EXPECT_TRUE(torch::allclose(flat_params(*p.model), adam_path({avg0, own1}), 1e-5, 1e-6));
  p.opt->with_collaboration_parameters([&] { seen = flat_params(*p.model); });
  EXPECT_TRUE(torch::allclose(seen, p1, 1e-5, 1e-6));
  EXPECT_EQ(p.opt->state_digest(), digest_of(seen))
      << "the digest (identical on every peer) is of the stepped master";

  p.collab->open();
  ASSERT_TRUE(wait_until(
      [&] {
        p.feed();
        return p.opt->local_epoch() == 2;
      },
      30s));
  const auto p2 = adam_path({avg0, (own1 + partner) / 2});
  EXPECT_TRUE(torch::allclose(flat_params(*p.model), p2, 1e-5, 1e-6));
  EXPECT_EQ(p.opt->state_digest(), digest_of(flat_params(*p.model)));
  p.opt->finish_round();
  ASSERT_TRUE(p.opt->shutdown());
  EXPECT_TRUE(torch::allclose(flat_params(*p.model), p2, 1e-5, 1e-6));
}
