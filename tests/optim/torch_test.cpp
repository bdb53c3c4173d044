// Tests that need torch, kept in one translation unit (torch headers cost ~20 s each):
// DiLoCo outer step, training state save/load and checkpoints, the built-in task.
#include <gtest/gtest.h>

#include <limits>

#include <torch/nn.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "starling/optim/diloco.hpp"
#include "starling/optim/fashion_task.hpp"
#include "starling/optim/training_state.hpp"
#include "support/temp_dir.hpp"

using namespace starling;
using namespace starling::optim;
namespace fs = std::filesystem;

namespace {

bool same_parameters(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  if (pa.size() != pb.size()) return false;
  for (std::size_t i = 0; i < pa.size(); ++i)
    if (!torch::equal(pa[i], pb[i])) return false;
  return true;
}

// One Adam step of `model` on a fixed batch.
void train_step(torch::nn::Sequential& model, torch::optim::Optimizer& opt, int seed) {
  torch::manual_seed(seed);
  auto x = torch::randn({8, 1, 28, 28});
  auto y = torch::randint(0, 10, {8});
  opt.zero_grad();
  torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  opt.step();
}

}  // namespace

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

// ---- Training state and checkpoints ----------------------------------------------------------

TEST(TrainingState, RoundTripRestoresModelAndOptimizer) {
  auto a = make_fashion_model(FashionModel::cnn, 1);
  torch::optim::Adam adam_a(a->parameters(), torch::optim::AdamOptions(1e-3));
  for (int i = 0; i < 3; ++i) train_step(a, adam_a, i);
  auto momentum = torch::randn({3});
  auto state = save_training_state(*a, &adam_a, {{"outer_momentum", momentum}});
  ASSERT_TRUE(state) << state.error().message();

  auto b = make_fashion_model(FashionModel::cnn, 2);  // different initial parameters
  torch::optim::Adam adam_b(b->parameters(), torch::optim::AdamOptions(1e-3));
  EXPECT_FALSE(same_parameters(*a, *b));
  NamedTensors extra{{"outer_momentum", torch::zeros({3})}};
  auto r = load_training_state(state.value(), *b, &adam_b, &extra);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_TRUE(same_parameters(*a, *b));
  EXPECT_TRUE(torch::equal(extra[0].second, momentum));
  // Same optimizer state: the next step gives bit-identical parameters. (With a fresh Adam
  // the first step would differ: its moments start at zero.)
  train_step(a, adam_a, 10);
  train_step(b, adam_b, 10);
  EXPECT_TRUE(same_parameters(*a, *b));
}

TEST(TrainingState, RejectsMismatchAndGarbageWithoutTouchingTheModel) {
  auto mlp = make_fashion_model(FashionModel::mlp, 1);
  auto cnn = make_fashion_model(FashionModel::cnn, 1);
  auto cnn_before = make_fashion_model(FashionModel::cnn, 1);
  auto state = save_training_state(*mlp, nullptr);
  ASSERT_TRUE(state);
  auto r = load_training_state(state.value(), *cnn, nullptr);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::invalid_argument);
  EXPECT_TRUE(same_parameters(*cnn, *cnn_before));
  // Missing optimizer state, missing extras.
  torch::optim::Adam adam(mlp->parameters());
  EXPECT_FALSE(load_training_state(state.value(), *mlp, &adam));
  NamedTensors extra{{"x", torch::zeros({1})}};
  EXPECT_FALSE(load_training_state(state.value(), *mlp, nullptr, &extra));
  // Garbage and truncated archives are errors, not crashes.
  Bytes junk(1000, 0x42);
  EXPECT_FALSE(load_training_state(junk, *mlp, nullptr));
  Bytes cut(state.value().begin(), state.value().begin() + state.value().size() / 2);
  EXPECT_FALSE(load_training_state(cut, *mlp, nullptr));
}

// What a hostile or broken donor can send: parameters of another dtype or with NaN, and
// optimizer moments of other shapes. Each is refused, and the receiver's model and optimizer
// state stay exactly as they were (the moments are checked after Optimizer::load, so this
// also exercises the rollback).
TEST(TrainingState, HostileStateIsRefusedAndChangesNothing) {
  auto mine = make_fashion_model(FashionModel::mlp, 1);
  torch::optim::Adam adam(mine->parameters());
  train_step(mine, adam, 1);
  auto before = save_training_state(*mine, &adam);
  ASSERT_TRUE(before);
  auto unchanged = [&] {
    auto now = save_training_state(*mine, &adam);
    return now && now.value() == before.value();
  };

  // Parameters as float64.
  auto wide = make_fashion_model(FashionModel::mlp, 2);
  wide->to(torch::kFloat64);
  torch::optim::Adam adam_wide(wide->parameters());
  auto s1 = save_training_state(*wide, &adam_wide);
  ASSERT_TRUE(s1);
  auto r1 = load_training_state(s1.value(), *mine, &adam);
  ASSERT_FALSE(r1);
  EXPECT_NE(r1.error().message().find("Double"), std::string::npos) << r1.error().message();
  EXPECT_TRUE(unchanged());

  // A NaN parameter.
  auto nan = make_fashion_model(FashionModel::mlp, 3);
  {
    torch::NoGradGuard g;
    nan->parameters()[0].view(-1)[5] = std::numeric_limits<float>::quiet_NaN();
  }
  torch::optim::Adam adam_nan(nan->parameters());
  auto s2 = save_training_state(*nan, &adam_nan);
  ASSERT_TRUE(s2);
  auto r2 = load_training_state(s2.value(), *mine, &adam);
  ASSERT_FALSE(r2);
  EXPECT_NE(r2.error().message().find("non-finite"), std::string::npos) << r2.error().message();
  EXPECT_TRUE(unchanged());

  // Right parameters, but Adam moments of flattened shapes (same count of tensors).
  auto donor = make_fashion_model(FashionModel::mlp, 4);
  std::vector<torch::Tensor> flat;
  for (auto& p : donor->parameters()) {
    flat.push_back(torch::zeros({p.numel()}, torch::requires_grad()));
    flat.back().mutable_grad() = torch::ones({p.numel()});
  }
  torch::optim::Adam adam_flat(flat);
  adam_flat.step();
  auto s3 = save_training_state(*donor, &adam_flat);
  ASSERT_TRUE(s3);
  auto r3 = load_training_state(s3.value(), *mine, &adam);
  ASSERT_FALSE(r3);
  EXPECT_NE(r3.error().message().find("optimizer state of shape"), std::string::npos)
      << r3.error().message();
  EXPECT_TRUE(unchanged());
  // And the receiver still trains.
  train_step(mine, adam, 5);

  // A well-formed state of the same model loads.
  torch::optim::Adam adam_donor(donor->parameters());
  train_step(donor, adam_donor, 6);
  auto s4 = save_training_state(*donor, &adam_donor);
  ASSERT_TRUE(s4);
  ASSERT_TRUE(load_training_state(s4.value(), *mine, &adam));
  EXPECT_TRUE(same_parameters(*mine, *donor));
}

TEST(TrainingState, CheckpointSaveAndResume) {
  test::TempDir dir("torch");
  auto cd = CheckpointDir::open(dir.path);
  ASSERT_TRUE(cd);
  auto a = make_fashion_model(FashionModel::mlp, 1);
  torch::optim::Adam adam_a(a->parameters());
  train_step(a, adam_a, 1);
  CheckpointMeta m;
  m.run_id = "r";
  m.epoch = 12;
  m.samples_total = 345;
  m.task = "fashion-mnist/mlp";
  ASSERT_TRUE(save_checkpoint(cd.value(), m, *a, &adam_a));

  auto b = make_fashion_model(FashionModel::mlp, 2);
  torch::optim::Adam adam_b(b->parameters());
  auto loaded = load_latest_checkpoint(cd.value(), *b, &adam_b);
  ASSERT_TRUE(loaded) << loaded.error().message();
  ASSERT_TRUE(loaded.value().has_value());
  EXPECT_EQ(loaded.value()->epoch, 12u);
  EXPECT_EQ(loaded.value()->samples_total, 345u);
  EXPECT_EQ(loaded.value()->parameter_names, parameter_names(*a));
  EXPECT_TRUE(same_parameters(*a, *b));

  auto wrong = make_fashion_model(FashionModel::cnn, 1);
  EXPECT_FALSE(load_latest_checkpoint(cd.value(), *wrong, nullptr));
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
