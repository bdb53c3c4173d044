// starling::Optimizer: alone (accumulation, DiLoCo, checkpoints) and with peers in one process
// over the Hub test double (steps together, identical parameters, joiners, dead peers).
#include <gtest/gtest.h>

#include <torch/nn.h>
#include <torch/optim/adam.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <atomic>
#include <cmath>
#include <thread>

#include "optim/fake_collaboration.hpp"
#include "optim/hub_peer.hpp"
#include "optim/linear_task.hpp"
#include "starling/optim/diloco.hpp"
#include "starling/optim/optimizer.hpp"
#include "starling/optim/training_state.hpp"
#include "support/temp_dir.hpp"

using namespace starling;
using namespace starling::optim;
using namespace starling::training;
namespace fs = std::filesystem;

namespace {

using test::batch;
using test::expect_agreement;
using test::flat_params;
using test::HubPeer;
using test::make_linear;
using test::wait_until;

void backward(torch::nn::Linear& m, const torch::Tensor& x, const torch::Tensor& y) {
  torch::mse_loss(m->forward(x), y).backward();
}

OptimizerOptions options(std::uint64_t target, std::size_t batch_size) {
  return test::hub_options("test", target, batch_size);
}

}  // namespace

TEST(Optimizer, ValidatesOptionsAndParameters) {
  auto m = make_linear(1);
  auto o = options(12, 4);
  o.run_id.clear();
  EXPECT_FALSE(Optimizer::create(*m, std::make_unique<torch::optim::SGD>(m->parameters(), 0.1), o));
  o = options(12, 4);
  o.progress.max_publish_interval = Duration::zero();
  EXPECT_FALSE(Optimizer::create(*m, std::make_unique<torch::optim::SGD>(m->parameters(), 0.1), o));
  o = options(12, 4);
  auto other = make_linear(2);
  auto r = Optimizer::create(*m, std::make_unique<torch::optim::SGD>(other->parameters(), 0.1), o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::invalid_argument);
  o.batch_size = 0;
  auto ok = Optimizer::create(*m, std::make_unique<torch::optim::SGD>(m->parameters(), 0.1), o);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok.value()->step().error(), errc::invalid_argument);  // no batch size anywhere
}

// The state format carries SGD, Adam, AdamW, RMSprop and Adagrad; any other optimizer is
// refused up front (it would fail at the first state transfer or checkpoint).
TEST(Optimizer, RefusesOptimizersTheStateFormatCannotCarry) {
  auto m = make_linear(1);
  auto r =
      Optimizer::create(*m, std::make_unique<torch::optim::LBFGS>(m->parameters()), options(12, 4));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::unsupported);
  EXPECT_NE(r.error().message().find("LBFGS"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("SGD, Adam"), std::string::npos) << r.error().message();
  EXPECT_TRUE(
      Optimizer::create(*m, std::make_unique<torch::optim::Adam>(m->parameters()), options(12, 4)));
}

// shutdown() publishes the last progress record with a 1 s ttl, so the others stop counting
// this peer within a second rather than after progress_ttl (10 s here).
TEST(Optimizer, ShutdownPublishesAShortLivedLastRecord) {
  auto hub = std::make_shared<test::Hub>(500ms);
  HubPeer peer(hub, 1, options(2000, 8));
  const auto self = peer.collab->self();
  ASSERT_TRUE(wait_until(
      [&] {
        std::lock_guard lk(hub->mu);
        return hub->records.count(self) > 0;
      },
      10s));
  {
    std::lock_guard lk(hub->mu);
    EXPECT_EQ(hub->records[self].second.second, Duration(10s));
  }
  ASSERT_TRUE(peer.opt->shutdown(5s));
  std::lock_guard lk(hub->mu);
  EXPECT_EQ(hub->records[self].second.second, Duration(1s));
}

// Alone, three batches of 4 with target 12 are one SGD step on the mean gradient of all 12
// samples: the same as one plain step on the concatenated batch.
TEST(Optimizer, AloneAccumulatesToTheTargetThenSteps) {
  auto m = make_linear(1);
  auto ref = make_linear(1);
  auto opt = Optimizer::create(*m, std::make_unique<torch::optim::SGD>(m->parameters(), 0.1),
                               options(12, 4))
                 .value();
  torch::optim::SGD ref_opt(ref->parameters(), 0.1);
  torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(7);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<torch::Tensor> xs, ys;
    for (int b = 0; b < 3; ++b) {
      auto [x, y] = batch(gen, 4);
      xs.push_back(x);
      ys.push_back(y);
      backward(m, x, y);
      auto rep = opt->step();
      ASSERT_TRUE(rep);
      EXPECT_EQ(rep.value().stepped, b == 2) << epoch << "/" << b;
      EXPECT_EQ(rep.value().action, b == 2 ? Action::step_alone : Action::accumulate);
    }
    ref_opt.zero_grad();
    backward(ref, torch::cat(xs), torch::cat(ys));
    ref_opt.step();
    EXPECT_TRUE(torch::allclose(flat_params(*m), flat_params(*ref), 1e-5, 1e-6)) << epoch;
    EXPECT_EQ(opt->local_epoch(), static_cast<std::uint64_t>(epoch + 1));
  }
  auto st = opt->status();
  EXPECT_EQ(st.samples_total, 36u);
  EXPECT_EQ(st.collaboration.num_peers, 1u);
}

// Worker momentum: each step applies the bias-corrected moving average of the epochs' mean
// gradients (m = b m + (1 - b) g, m / (1 - b^t)), not the epoch's gradient itself.
TEST(Optimizer, WorkerMomentumStepsWithTheMovingAverage) {
  auto m = make_linear(1);
  auto ref = make_linear(1);
  auto o = options(8, 8);
  o.worker_momentum = 0.5;
  auto opt =
      Optimizer::create(*m, std::make_unique<torch::optim::SGD>(m->parameters(), 0.1), o).value();
  torch::optim::SGD ref_opt(ref->parameters(), 0.1);
  torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(11);
  std::vector<torch::Tensor> avg;
  for (int epoch = 0; epoch < 4; ++epoch) {
    auto [x, y] = batch(gen, 8);
    backward(m, x, y);
    ASSERT_TRUE(opt->step());
    ref_opt.zero_grad();
    backward(ref, x, y);
    const double bc = 1 - std::pow(0.5, epoch + 1);
    auto params = ref->parameters();
    if (avg.empty())
      for (auto& p : params) avg.push_back(torch::zeros_like(p));
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < params.size(); ++i) {
        avg[i] = avg[i] * 0.5 + params[i].grad() * 0.5;
        params[i].mutable_grad().copy_(avg[i] / bc);
      }
    }
    ref_opt.step();
    EXPECT_TRUE(torch::allclose(flat_params(*m), flat_params(*ref), 1e-5, 1e-6)) << epoch;
  }
  o.worker_momentum = 1;
  EXPECT_FALSE(Optimizer::create(*m, std::make_unique<torch::optim::SGD>(m->parameters(), 0.1), o));
}

// Alone in DiLoCo mode: the inner optimizer steps every batch; after H batches the outer step
// applies the peer's own pseudo-gradient with Nesterov momentum.
TEST(Optimizer, AloneDilocoOuterStepEveryHBatches) {
  auto m = make_linear(1);
  auto ref = make_linear(1);
  auto o = options(0, 4);
  o.diloco_steps = 3;
  o.outer.lr = 0.5;
  o.outer.momentum = 0.8;
  auto opt =
      Optimizer::create(*m, std::make_unique<torch::optim::SGD>(m->parameters(), 0.05), o).value();
  torch::optim::SGD ref_inner(ref->parameters(), 0.05);
  std::vector<torch::Tensor> ref_params = ref->parameters();
  DilocoState ref_outer;
  ref_outer.reset(ref_params);
  torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(3);
  for (int round = 0; round < 3; ++round) {
    for (int b = 0; b < 3; ++b) {
      auto [x, y] = batch(gen, 4);
      backward(m, x, y);
      auto rep = opt->step();
      ASSERT_TRUE(rep);
      EXPECT_EQ(rep.value().stepped, b == 2);
      ref_inner.zero_grad();
      backward(ref, x, y);
      ref_inner.step();
    }
    auto g = ref_outer.pseudo_gradient(ref_params);
    ref_outer.outer_step(ref_params, g, o.outer);
    EXPECT_TRUE(torch::allclose(flat_params(*m), flat_params(*ref), 1e-5, 1e-6)) << round;
  }
}

TEST(Optimizer, CheckpointAndResume) {
  test::TempDir dir("opt");
  auto o = options(8, 4);
  o.checkpoint_dir = dir.path;
  o.checkpoint_every = 1;
  torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(5);
  torch::Tensor saved;
  {
    auto m = make_linear(1);
    auto opt =
        Optimizer::create(*m, std::make_unique<torch::optim::Adam>(m->parameters()), o).value();
    EXPECT_FALSE(opt->resumed_from());
    for (int i = 0; i < 6; ++i) {
      auto [x, y] = batch(gen, 4);
      backward(m, x, y);
      ASSERT_TRUE(opt->step());
    }
    EXPECT_EQ(opt->local_epoch(), 3u);
    ASSERT_TRUE(opt->shutdown());
    saved = flat_params(*m);
  }
  auto m2 = make_linear(99);
  auto opt2 =
      Optimizer::create(*m2, std::make_unique<torch::optim::Adam>(m2->parameters()), o).value();
  ASSERT_TRUE(opt2->resumed_from());
  EXPECT_EQ(opt2->resumed_from()->epoch, 3u);
  EXPECT_EQ(opt2->resumed_from()->samples_total, 24u);
  EXPECT_EQ(opt2->local_epoch(), 3u);
  EXPECT_TRUE(torch::equal(flat_params(*m2), saved));
}

// ---- Several peers over the Hub ----------------------------------------------------------

TEST(OptimizerCollaboration, PeersStepTogetherJoinersCatchUpDeadPeersDoNotStall) {
  auto hub = std::make_shared<test::Hub>(500ms);
  // Epochs of ~0.5 s: several times the refresh interval, as with real targets.
  auto o = options(2000, 8);
  std::mutex mu;
  std::map<std::uint64_t, std::vector<torch::Tensor>> record;
  std::vector<std::unique_ptr<HubPeer>> peers;
  // Three peers from the same initial parameters (as with a shared seed).
  for (int i = 0; i < 3; ++i) peers.push_back(std::make_unique<HubPeer>(hub, 1, o));
  for (int i = 0; i < 3; ++i) peers[i]->start(100 + i, mu, record);
  auto min_epoch = [&] { return test::min_live_epoch(peers); };
  ASSERT_TRUE(wait_until([&] { return min_epoch() >= 5; }, 60s)) << "no progress";

  // A joiner with different initial parameters downloads the state and takes part.
  peers.push_back(std::make_unique<HubPeer>(hub, 42, o));
  peers.back()->start(200, mu, record);
  ASSERT_TRUE(wait_until([&] { return peers.back()->downloads > 0; }, 30s))
      << "joiner never loaded state";
  const std::uint64_t joined_at = peers.back()->epoch;
  ASSERT_TRUE(wait_until([&] { return min_epoch() >= joined_at + 3; }, 60s));

  // A peer dies mid-training: the others continue (after at most one round window).
  peers[0]->kill();
  const std::uint64_t died_at = min_epoch();
  ASSERT_TRUE(wait_until([&] { return min_epoch() >= died_at + 3; }, 60s)) << "stalled";

  for (auto& p : peers) {
    p->stop = true;
    if (p->thread.joinable()) p->thread.join();
    EXPECT_EQ(p->failures, 0);
    if (p->solo_steps > 0) std::printf("a peer stepped alone %d times\n", p->solo_steps.load());
  }
  std::lock_guard lk(mu);
  expect_agreement(record, 8);
  EXPECT_GT(hub->rounds_closed, 8u);
  // The collaboration learned: the loss on fresh data is well below the initial model's.
  torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(999);
  auto [x, y] = batch(gen, 1000);
  auto initial = make_linear(1);
  const double before = torch::mse_loss(initial->forward(x), y).item<double>();
  const double after = torch::mse_loss(peers[1]->model->forward(x), y).item<double>();
  EXPECT_LT(after, 0.5 * before) << before << " -> " << after;
  std::printf("epochs: %llu, rounds: %llu, loss %.3f -> %.3f\n",
              static_cast<unsigned long long>(peers[1]->epoch.load()),
              static_cast<unsigned long long>(hub->rounds_closed), before, after);
}

// Delayed parameter updates with three peers: rounds and steps run in the background, and
// after every epoch all peers hold identical parameters (same averaged gradient, same step),
// whatever the model held while computing (DelayCorrection).
static void delayed_updates_keep_peers_identical(DelayCorrection correction) {
  auto hub = std::make_shared<test::Hub>(500ms);
  auto o = options(2000, 8);
  o.delay_optimizer_step = true;
  o.delay_correction = correction;
  std::mutex mu;
  std::map<std::uint64_t, std::vector<torch::Tensor>> record;
  std::vector<std::unique_ptr<HubPeer>> peers;
  for (int i = 0; i < 3; ++i) peers.push_back(std::make_unique<HubPeer>(hub, 1, o));
  for (int i = 0; i < 3; ++i) peers[i]->start(300 + i, mu, record);
  ASSERT_TRUE(wait_until([&] { return test::min_live_epoch(peers) >= 8; }, 90s)) << "no progress";
  for (auto& p : peers) {
    p->stop = true;
    if (p->thread.joinable()) p->thread.join();
    EXPECT_EQ(p->failures, 0);
  }
  std::lock_guard lk(mu);
  expect_agreement(record, 6);
  EXPECT_GE(hub->rounds_closed, 8u);
}

TEST(OptimizerCollaboration, DelayedUpdatesKeepPeersIdentical) {
  delayed_updates_keep_peers_identical(DelayCorrection::predict);
}

TEST(OptimizerCollaboration, DelayedUpdatesWithLocalStepsKeepPeersIdentical) {
  delayed_updates_keep_peers_identical(DelayCorrection::local);
}
