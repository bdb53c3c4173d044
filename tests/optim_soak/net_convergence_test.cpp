// Collaborative training of the real task over the real network (NetCollaboration: Host on
// loopback, DhtNode, Averagers; one io thread per peer) against training alone: convergence
// parity (same total samples and batch size, within 1 point) and DiLoCo (H = 20: within 2
// points of synchronous training, >= 10x fewer bytes, both measured by the collaboration's own
// byte counters). Label soak (minutes on the 2-core machine): ctest -L soak.
#include <gtest/gtest.h>

#include <cmath>

#include "optim_soak/net_peers.hpp"

using namespace starling;
using namespace starling::optim;
using namespace starling::training;
using starling::test::NetFashionPeer;

namespace {

double seconds_since(TimePoint t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Outcome {
  double accuracy = 0;
  std::uint64_t bytes = 0;            // sent, all peers, from their collaborations' counters
  std::uint64_t samples = 0;          // computed, all peers
  std::uint64_t stepped_samples = 0;  // averaged into the steps (peer 0's view)
  int rounds = 0;                     // collaborative steps, all peers
  double seconds = 0;
};

// kPeers peers from the same initial parameters train to `epochs`; all must agree after every
// epoch and at the end.
Outcome collaborate(const test::FashionSetup& s, const OptimizerOptions& o, std::uint64_t epochs,
                    std::uint64_t data_seed, Duration pace = Duration::zero()) {
  constexpr int kPeers = 4;
  std::vector<std::unique_ptr<NetFashionPeer>> peers;
  peers.push_back(
      std::make_unique<NetFashionPeer>(s, std::vector<net::Multiaddr>{}, o, 0, data_seed));
  for (int i = 1; i < kPeers; ++i)
    peers.push_back(
        std::make_unique<NetFashionPeer>(s, peers[0]->addresses(), o, 0, data_seed + i));
  test::ParameterLog log;
  const auto t0 = Clock::now();
  for (auto& p : peers) {
    p->peer().linger();  // a peer that missed the last round downloads it from the others
    p->peer().pace(pace);
    p->peer().start(epochs, &log);
  }
  const bool all_done = test::wait_for(
      [&] {
        for (auto& p : peers)
          if (!p->peer().finished) return false;
        return true;
      },
      900s);
  EXPECT_TRUE(all_done) << "some peer never reached epoch " << epochs;
  for (auto& p : peers) p->peer().stop();
  for (auto& p : peers) p->peer().join();
  Outcome out;
  out.seconds = seconds_since(t0);
  for (auto& p : peers) {
    EXPECT_EQ(p->peer().failures, 0);
    EXPECT_EQ(p->peer().optimizer().local_epoch(), epochs);
    out.samples += p->peer().samples;
    out.rounds += p->peer().rounds;
    out.bytes += p->bytes_sent();
  }
  out.stepped_samples = peers[0]->peer().stepped_samples;
  std::size_t checked = 0;
  EXPECT_EQ(log.disagreements(&checked), 0u) << log.disagreement_detail();
  EXPECT_GE(checked, epochs / 2) << "too few epochs recorded by several peers";
  const auto h = test::parameter_hash(*peers[0]->peer().model());
  for (auto& p : peers) EXPECT_EQ(test::parameter_hash(*p->peer().model()), h);
  FashionData test(s.test);
  out.accuracy = peers[0]->peer().evaluate(test).accuracy;
  return out;
}

}  // namespace

// 4 peers over the network and one process alone with the same total samples and batch size:
// the alone run steps every B samples, B the collaboration's mean samples per step (rounded
// to whole batches), for as many steps: test accuracy within 1 percentage point of the mean
// of three alone runs (data orders 1-3; one run of either side moves by about a point).
TEST(NetConvergence, FourPeersMatchOneProcessAlone) {
  auto* s = test::fashion_setup();
  if (!s) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  constexpr std::uint64_t kEpochs = 60;
  const auto o = test::net_options(1024, s->batch);
  const auto together = collaborate(*s, o, kEpochs, 10);
  EXPECT_GE(together.rounds, static_cast<int>(kEpochs)) << "the peers rarely averaged together";
  const double mean_step = static_cast<double>(together.stepped_samples) / kEpochs;
  const auto alone_o = test::same_samples_alone(o, together.stepped_samples, kEpochs);
  const auto t0 = Clock::now();
  const double alone = test::train_alone_mean(*s, alone_o, kEpochs);
  const double alone_seconds = seconds_since(t0);
  std::printf(
      "4 peers over the network: accuracy %.4f, %llu samples computed, %.1f averaged per step, "
      "%d collaborative steps, %llu bytes sent (%.2f MB per peer per epoch), %.1f s\n"
      "alone (mean of 3): accuracy %.4f, %llu samples (target %llu), %.1f s; difference %.2f "
      "points\n",
      together.accuracy, static_cast<unsigned long long>(together.samples), mean_step,
      together.rounds, static_cast<unsigned long long>(together.bytes),
      static_cast<double>(together.bytes) / 4 / kEpochs / 1e6, together.seconds, alone,
      static_cast<unsigned long long>(kEpochs * alone_o.target_batch_size),
      static_cast<unsigned long long>(alone_o.target_batch_size), alone_seconds,
      100 * (together.accuracy - alone));
  EXPECT_GT(alone, 0.75);  // it learned
  EXPECT_GT(together.bytes, 0u);
  EXPECT_NEAR(together.accuracy, alone, 0.01);
}

// DiLoCo with H = 20 against synchronous data-parallel training (a round after every local
// batch), both over the network with the same planned samples: accuracy within 2 points and
// >= 10x fewer bytes sent, as counted by the collaborations. Each local step is paced to take
// >= 150 ms: an MLP batch computes in a few ms, and rounds that come faster than the progress
// records refresh (50-300 ms) make every peer see the others behind and step alone.
TEST(NetConvergence, DilocoH20CloseToSynchronousWithTenTimesFewerBytes) {
  auto* s = test::fashion_setup();
  if (!s) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  constexpr std::uint64_t kPeers = 4, kRounds = 8, kH = 20;
  constexpr Duration kPace = 150ms;
  const std::uint64_t planned = kRounds * kH * kPeers * s->batch;
  const auto sync_o = test::net_options(kPeers * s->batch, s->batch);
  // The synchronous reference is the mean of two runs (data orders 40 and 50): one run's
  // accuracy moves by 2-4 points with the timing of its rounds (0.80-0.84 seen),
  // DiLoCo's by far less (0.8264-0.8274 in five runs).
  auto sync = collaborate(*s, sync_o, kRounds * kH, 40, kPace);
  const auto sync2 = collaborate(*s, sync_o, kRounds * kH, 50, kPace);
  std::printf("synchronous runs: accuracy %.4f and %.4f, %.1f s and %.1f s\n", sync.accuracy,
              sync2.accuracy, sync.seconds, sync2.seconds);
  std::fflush(stdout);
  sync.accuracy = (sync.accuracy + sync2.accuracy) / 2;
  sync.bytes = (sync.bytes + sync2.bytes) / 2;
  sync.samples = (sync.samples + sync2.samples) / 2;
  auto diloco_o = test::net_options(kPeers * s->batch, s->batch);
  diloco_o.diloco_steps = kH;
  const auto diloco = collaborate(*s, diloco_o, kRounds, 40, kPace);
  const double ratio = static_cast<double>(sync.bytes) /
                       static_cast<double>(std::max<std::uint64_t>(1, diloco.bytes));
  std::printf(
      "synchronous (mean of 2): accuracy %.4f, %llu bytes sent, %llu samples, %.1f s\n"
      "DiLoCo H=20: accuracy %.4f, %llu bytes sent, %llu samples, %.1f s\n"
      "planned samples %llu each; bytes ratio %.1f; accuracy difference %.2f points\n",
      sync.accuracy, static_cast<unsigned long long>(sync.bytes),
      static_cast<unsigned long long>(sync.samples), sync.seconds, diloco.accuracy,
      static_cast<unsigned long long>(diloco.bytes),
      static_cast<unsigned long long>(diloco.samples), diloco.seconds,
      static_cast<unsigned long long>(planned), ratio, 100 * (diloco.accuracy - sync.accuracy));
  EXPECT_GT(sync.accuracy, 0.7);
  EXPECT_NEAR(diloco.accuracy, sync.accuracy, 0.02);
  EXPECT_GT(diloco.bytes, 0u);
  EXPECT_GE(sync.bytes, 10 * diloco.bytes);
}
