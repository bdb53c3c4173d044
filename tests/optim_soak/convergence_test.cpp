// Collaborative training of the real task against training alone: convergence parity (same
// total samples and batch size), churn (peers die and join, live peers agree after every
// epoch) and DiLoCo (H = 20: accuracy close to synchronous with far fewer bytes). Peers run in
// one process over the Hub double of the network (tests/optim/fake_collaboration.hpp).
// Label soak (minutes on the 2-core machine): ctest -L soak, or make test-all.
#include <gtest/gtest.h>

#include "optim/fashion_peers.hpp"

using namespace starling;
using namespace starling::optim;
using namespace starling::training;
using starling::test::FashionPeer;
using starling::test::FashionSetup;
using starling::test::fast_options;
using starling::test::train_alone;

namespace {

const FashionSetup* setup() {
  return test::fashion_setup();
}

}  // namespace

// 4 collaborating peers and one process alone, same total samples and batch size (the alone
// run's batch is the collaboration's mean samples per step): accuracy within 1 point of the
// mean of three alone runs (data orders 1-3).
TEST(Convergence, FourPeersMatchOneProcessAlone) {
  auto* s = setup();
  if (!s) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  constexpr std::uint64_t kEpochs = 60;
  const auto o = fast_options(1024, s->batch);
  auto hub = std::make_shared<test::Hub>(2s);
  std::vector<std::unique_ptr<FashionPeer>> peers;
  test::ParameterLog log;
  for (int i = 0; i < 4; ++i) peers.push_back(std::make_unique<FashionPeer>(*s, hub, o, 0, 10 + i));
  for (auto& p : peers) p->start(kEpochs, &log);
  for (auto& p : peers) p->join();
  std::uint64_t samples = 0;
  for (auto& p : peers) {
    EXPECT_EQ(p->failures, 0);
    EXPECT_EQ(p->optimizer().local_epoch(), kEpochs);
    samples += p->samples;
  }
  std::size_t checked = 0;
  EXPECT_EQ(log.disagreements(&checked), 0u) << log.disagreement_detail();
  EXPECT_GE(checked, kEpochs / 2);
  FashionData test(s->test);
  const double together = peers[0]->evaluate(test).accuracy;
  for (auto& p : peers) EXPECT_EQ(p->evaluate(test).accuracy, together);
  const auto alone_o = test::same_samples_alone(o, peers[0]->stepped_samples, kEpochs);
  const double alone = test::train_alone_mean(*s, alone_o, kEpochs);
  std::printf("4 peers: %.4f (%llu samples computed, %llu averaged), alone: %.4f (%llu samples)\n",
              together, static_cast<unsigned long long>(samples),
              static_cast<unsigned long long>(peers[0]->stepped_samples.load()), alone,
              static_cast<unsigned long long>(kEpochs * alone_o.target_batch_size));
  EXPECT_GT(alone, 0.75);  // it learned
  EXPECT_NEAR(together, alone, 0.01);
}

// Churn: a peer dies mid-training and a new one (with other initial parameters) joins; the
// others never stall, the joiner downloads the state and takes part, and all live peers hold
// identical parameters after every epoch.
TEST(Convergence, ChurnJoinersCatchUpAndLivePeersAgree) {
  auto* s = setup();
  if (!s) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const auto o = fast_options(512, s->batch);
  auto hub = std::make_shared<test::Hub>(1s);
  test::ParameterLog log;
  std::vector<std::unique_ptr<FashionPeer>> peers;
  for (int i = 0; i < 3; ++i) peers.push_back(std::make_unique<FashionPeer>(*s, hub, o, 0, 20 + i));
  for (auto& p : peers) p->start(UINT64_MAX, &log);
  auto min_live_epoch = [&] {
    std::uint64_t e = UINT64_MAX;
    for (auto& p : peers)
      if (!p->finished) e = std::min<std::uint64_t>(e, p->epoch);
    return e;
  };
  ASSERT_TRUE(test::wait_for([&] { return min_live_epoch() >= 4; }, 120s)) << "no progress";
  peers[0]->kill();
  peers[0]->finished = true;
  const auto died_at = min_live_epoch();
  ASSERT_TRUE(test::wait_for([&] { return min_live_epoch() >= died_at + 3; }, 120s)) << "stalled";
  peers.push_back(std::make_unique<FashionPeer>(*s, hub, o, 99, 30));  // other initial params
  peers.back()->start(UINT64_MAX, &log);
  ASSERT_TRUE(test::wait_for([&] { return peers.back()->downloads > 0; }, 120s))
      << "joiner never loaded state";
  const auto joined_at = peers.back()->epoch.load();
  ASSERT_TRUE(test::wait_for([&] { return min_live_epoch() >= joined_at + 4; }, 120s));
  for (auto& p : peers) p->stop();
  for (auto& p : peers) p->join();
  for (auto& p : peers) EXPECT_EQ(p->failures, 0);
  std::size_t checked = 0;
  EXPECT_EQ(log.disagreements(&checked), 0u) << log.disagreement_detail();
  EXPECT_GE(checked, 8u);
  // The live peers end on identical parameters if they end at the same epoch.
  if (peers[1]->epoch == peers.back()->epoch) {
    EXPECT_EQ(test::parameter_hash(*peers[1]->model()),
              test::parameter_hash(*peers.back()->model()));
  }
}

// DiLoCo with H = 20 against synchronous data-parallel training (an averaging round after
// every local batch), same samples: accuracy within 2 points, >= 10x fewer bytes sent.
TEST(Convergence, DilocoH20CloseToSynchronousWithTenTimesFewerBytes) {
  auto* s = setup();
  if (!s) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  constexpr int kPeers = 4;
  constexpr std::uint64_t kRounds = 12, kH = 20;
  const std::uint64_t per_round = kPeers * kH * s->batch;
  struct Outcome {
    double accuracy = 0;
    std::uint64_t bytes = 0;
    std::uint64_t samples = 0;
  };
  auto collaborate = [&](const OptimizerOptions& o, std::uint64_t epochs) {
    auto hub = std::make_shared<test::Hub>(2s);
    std::vector<std::unique_ptr<FashionPeer>> peers;
    for (int i = 0; i < kPeers; ++i)
      peers.push_back(std::make_unique<FashionPeer>(*s, hub, o, 0, 40 + i));
    for (auto& p : peers) p->start(epochs);
    for (auto& p : peers) p->join();
    Outcome out;
    FashionData test(s->test);
    out.accuracy = peers[0]->evaluate(test).accuracy;
    for (auto& p : peers) {
      EXPECT_EQ(p->failures, 0);
      out.bytes += p->bytes_sent;
      out.samples += p->samples;
    }
    return out;
  };
  auto sync_o = fast_options(kPeers * s->batch, s->batch);
  const auto sync = collaborate(sync_o, kRounds * kH);
  auto diloco_o = fast_options(kPeers * s->batch, s->batch);
  diloco_o.diloco_steps = kH;
  const auto diloco = collaborate(diloco_o, kRounds);
  std::printf(
      "synchronous: %.4f, %llu bytes, %llu samples; DiLoCo H=20: %.4f, %llu bytes, "
      "%llu samples (%llu planned); bytes ratio %.1f\n",
      sync.accuracy, static_cast<unsigned long long>(sync.bytes),
      static_cast<unsigned long long>(sync.samples), diloco.accuracy,
      static_cast<unsigned long long>(diloco.bytes),
      static_cast<unsigned long long>(diloco.samples),
      static_cast<unsigned long long>(kRounds * per_round),
      static_cast<double>(sync.bytes) /
          static_cast<double>(std::max<std::uint64_t>(1, diloco.bytes)));
  EXPECT_GT(sync.accuracy, 0.7);
  EXPECT_NEAR(diloco.accuracy, sync.accuracy, 0.02);
  EXPECT_GT(diloco.bytes, 0u);
  EXPECT_GE(sync.bytes, 10 * diloco.bytes);
}
