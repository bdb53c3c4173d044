// Forked parameters over the Hub double: peers at one epoch holding different parameters (here
// by construction: different initial seeds) find out from the digests in their progress
// records; the digest most peers hold wins (a tie: the larger value), the others download
// that state, and from then on every epoch holds identical parameters on every peer.
#include <gtest/gtest.h>

#include "optim/hub_peer.hpp"

using namespace starling;
using namespace starling::optim;
using namespace starling::training;

namespace {

using test::HubPeer;

OptimizerOptions fork_options() {
  return test::hub_options("fork", 2000, 8);
}

struct Forked {
  std::shared_ptr<test::Hub> hub = std::make_shared<test::Hub>(500ms);
  std::vector<std::unique_ptr<HubPeer>> peers;
  std::mutex mu;
  std::map<std::uint64_t, std::vector<torch::Tensor>> record;

  explicit Forked(const std::vector<int>& seeds) {
    for (int s : seeds) peers.push_back(std::make_unique<HubPeer>(hub, s, fork_options()));
    // Everyone's record (with its digest) is known before anyone decides anything, so the
    // outcome does not depend on who looked first.
    for (auto& p : peers)
      EXPECT_TRUE(test::wait_until(
          [&] { return p->opt->status().collaboration.num_peers == peers.size(); }, 30s));
  }
  // Trains every peer to `epochs` and waits until all are there.
  void train(std::uint64_t epochs) {
    for (std::size_t i = 0; i < peers.size(); ++i)
      peers[i]->start(static_cast<int>(100 + i), mu, record, epochs);
    EXPECT_TRUE(test::wait_until(
        [&] {
          for (auto& p : peers)
            if (p->epoch < epochs) return false;
          return true;
        },
        120s))
        << "peers did not reach epoch " << epochs;
    for (auto& p : peers) {
      p->stop = true;
      if (p->thread.joinable()) p->thread.join();
      EXPECT_EQ(p->failures, 0);
    }
  }
};

}  // namespace

TEST(ForkRepair, TwoPeersForkedAtOneEpochConverge) {
  Forked f({1, 2});
  const auto d0 = f.peers[0]->opt->state_digest(), d1 = f.peers[1]->opt->state_digest();
  ASSERT_NE(d0, d1);
  const std::size_t winner = d0 > d1 ? 0 : 1, loser = 1 - winner;
  const auto winner_initial = test::flat_params(*f.peers[winner]->model);
  f.train(5);
  EXPECT_GE(f.peers[loser]->downloads, 1);
  EXPECT_EQ(f.peers[winner]->downloads, 0);
  EXPECT_EQ(f.peers[0]->opt->state_digest(), f.peers[1]->opt->state_digest());
  EXPECT_TRUE(
      torch::equal(test::flat_params(*f.peers[0]->model), test::flat_params(*f.peers[1]->model)));
  std::lock_guard lk(f.mu);
  // The loser's epoch 0 after its download: the winner's initial parameters.
  ASSERT_FALSE(f.record[0].empty());
  EXPECT_TRUE(torch::equal(f.record[0].front(), winner_initial));
  test::expect_agreement(f.record, 3);
  EXPECT_GE(f.hub->rounds_closed, 3u);
}

TEST(ForkRepair, ThreePeersTwoAgainstOneTheOneDownloads) {
  Forked f({1, 1, 2});
  ASSERT_EQ(f.peers[0]->opt->state_digest(), f.peers[1]->opt->state_digest());
  ASSERT_NE(f.peers[0]->opt->state_digest(), f.peers[2]->opt->state_digest());
  const auto majority_initial = test::flat_params(*f.peers[0]->model);
  f.train(4);
  EXPECT_EQ(f.peers[0]->downloads, 0);
  EXPECT_EQ(f.peers[1]->downloads, 0);
  EXPECT_GE(f.peers[2]->downloads, 1);
  for (auto& p : f.peers) EXPECT_EQ(p->opt->state_digest(), f.peers[0]->opt->state_digest());
  std::lock_guard lk(f.mu);
  ASSERT_FALSE(f.record[0].empty());
  EXPECT_TRUE(torch::equal(f.record[0].front(), majority_initial));
  test::expect_agreement(f.record, 3);
}
