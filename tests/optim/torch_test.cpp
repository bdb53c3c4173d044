// Tests that need torch (torch headers cost ~20 s per translation unit): DiLoCo outer step and
// the built-in task. Training state and checkpoints: training_state_test.cpp.
#include <gtest/gtest.h>

#include <torch/nn.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "starling/optim/diloco.hpp"
#include "starling/optim/fashion_task.hpp"
#include "torch_helpers.hpp"

using namespace starling;
using namespace starling::optim;
using namespace starling::training;

using torch_helpers::same_parameters;

// ---- DiLoCo -------------------------------------------------------------------------------

TEST(Diloco, OuterStepMatchesHandComputation) {
  // Two peers, two scalar parameters, outer lr 0.5, momentum 0.9 (Nesterov).
  OuterOptions o;
  o.lr = 0.5;
  o.momentum = 0.9;
  DilocoState s;
  std::vector<torch::Tensor> params{torch::tensor({1.0f}), torch::tensor({-2.0f})};
  s.reset(params);
  // Round 1: the peers end their local steps at (0.8, -1.5) and (0.6, -2.5).
  // Pseudo-gradients (anchor - local): (0.2, -0.5) and (0.4, 0.5); average (0.3, 0.0).
  std::vector<torch::Tensor> p1{torch::tensor({0.8f}), torch::tensor({-1.5f})};
  std::vector<torch::Tensor> p2{torch::tensor({0.6f}), torch::tensor({-2.5f})};
  auto g1 = s.pseudo_gradient(p1), g2 = s.pseudo_gradient(p2);
  EXPECT_NEAR(g1[0].item<float>(), 0.2f, 1e-6);
  EXPECT_NEAR(g2[1].item<float>(), 0.5f, 1e-6);
  std::vector<torch::Tensor> avg{(g1[0] + g2[0]) / 2, (g1[1] + g2[1]) / 2};
  s.outer_step(p1, avg, o);
  // buf = (0.3, 0); update = g + 0.9 buf = (0.57, 0); anchor = (1 - 0.285, -2) = (0.715, -2).
  EXPECT_NEAR(p1[0].item<float>(), 0.715f, 1e-6);
  EXPECT_NEAR(p1[1].item<float>(), -2.0f, 1e-6);
  EXPECT_NEAR(s.momentum()[0].item<float>(), 0.3f, 1e-6);
  // Round 2: local parameters (0.515, -1.9): g = (0.2, -0.1).
  // buf = 0.9 (0.3, 0) + (0.2, -0.1) = (0.47, -0.1); update = (0.2 + 0.423, -0.1 - 0.09)
  // = (0.623, -0.19); anchor = (0.715 - 0.3115, -2 + 0.095) = (0.4035, -1.905).
  std::vector<torch::Tensor> q{torch::tensor({0.515f}), torch::tensor({-1.9f})};
  auto g = s.pseudo_gradient(q);
  s.outer_step(q, g, o);
  EXPECT_NEAR(q[0].item<float>(), 0.4035f, 1e-6);
  EXPECT_NEAR(q[1].item<float>(), -1.905f, 1e-6);
  EXPECT_NEAR(s.anchors()[0].item<float>(), 0.4035f, 1e-6);
  EXPECT_EQ(s.outer_steps(), 2u);

  // Plain momentum (no Nesterov) uses the buffer itself.
  o.nesterov = false;
  DilocoState plain;
  std::vector<torch::Tensor> r{torch::tensor({1.0f})};
  plain.reset(r);
  std::vector<torch::Tensor> gr{torch::tensor({0.3f})};
  plain.outer_step(r, gr, o);
  EXPECT_NEAR(r[0].item<float>(), 1.0f - 0.5f * 0.3f, 1e-6);
}

TEST(Diloco, OuterStepEqualsTorchSgdNesterov) {
  // Independent check: torch::optim::SGD(nesterov) on the anchor with gradient g.
  torch::manual_seed(3);
  auto init = torch::randn({5, 4});
  auto anchor_ref = init.clone().requires_grad_(true);
  torch::optim::SGD sgd({anchor_ref},
                        torch::optim::SGDOptions(0.7).momentum(0.9).nesterov(true).dampening(0));
  DilocoState s;
  std::vector<torch::Tensor> params{init.clone()};
  s.reset(params);
  OuterOptions o;  // lr 0.7, momentum 0.9, nesterov
  for (int round = 0; round < 5; ++round) {
    auto g = torch::randn({5, 4});
    anchor_ref.mutable_grad() = g.clone();
    sgd.step();
    std::vector<torch::Tensor> gs{g};
    s.outer_step(params, gs, o);
    EXPECT_TRUE(torch::allclose(params[0], anchor_ref.detach(), 1e-5, 1e-6)) << round;
  }
}

// ---- The built-in task
// ---------------------------------------------------------------------------

TEST(FashionTask, LearnsSomethingQuickly) {
  auto train = load_fashion_mnist(kFashionMnistDefaultDir, Split::train);
  auto test = load_fashion_mnist(kFashionMnistDefaultDir, Split::test);
  if (!train || !test) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  torch::set_num_threads(1);
  FashionTask task(train.value(), FashionModel::mlp, 0, 7);
  FashionData test_data(test.value());
  auto before = evaluate(task.model(), test_data);
  EXPECT_LT(before.accuracy, 0.3);  // untrained: about chance (0.1)
  torch::optim::Adam adam(task.model()->parameters(), torch::optim::AdamOptions(1e-3));
  double loss = 0;
  for (int i = 0; i < 100; ++i) {  // 6,400 samples
    adam.zero_grad();
    loss = task.forward_backward(64);
    adam.step();
  }
  EXPECT_TRUE(std::isfinite(loss));
  auto after = evaluate(task.model(), test_data);
  EXPECT_GT(after.accuracy, 0.7);
  EXPECT_LT(after.loss, before.loss);
  EXPECT_EQ(after.samples, 10000u);
  // Deterministic models: the same seed gives the same parameters on every peer.
  auto m1 = make_fashion_model(FashionModel::cnn, 5), m2 = make_fashion_model(FashionModel::cnn, 5);
  EXPECT_TRUE(same_parameters(*m1, *m2));
}
