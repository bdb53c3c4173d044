// Churn over the real network: Fashion-MNIST peers on NetCollaboration (loopback, real DHT)
// are killed abruptly (their node vanishes mid-matchmaking, as a SIGKILLed process) and new
// peers with other initial parameters join; training never stalls, joiners download the state
// and take part, and every epoch's parameters are identical on all peers that reached it
// (a hash per peer per epoch, compared at the end). Label soak: ctest -L soak.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optim_soak/net_peers.hpp"

using namespace starling;
using namespace starling::optim;
using namespace starling::training;
using starling::test::NetFashionPeer;

namespace {

using Peers = std::vector<std::unique_ptr<NetFashionPeer>>;

std::uint64_t min_live_epoch(const Peers& peers) {
  std::uint64_t e = UINT64_MAX;
  for (const auto& p : peers)
    if (!p->crashed()) e = std::min<std::uint64_t>(e, p->peer().epoch);
  return e;
}

std::uint64_t max_live_epoch(const Peers& peers) {
  std::uint64_t e = 0;
  for (const auto& p : peers)
    if (!p->crashed()) e = std::max<std::uint64_t>(e, p->peer().epoch);
  return e;
}

// Kills peers[i] at its next matchmaking; the others must then advance `epochs` more epochs.
void kill_and_continue(Peers& peers, std::size_t i, std::uint64_t epochs) {
  const auto t0 = Clock::now();
  const bool at_matchmaking = peers[i]->crash_at_matchmaking(60s);
  const auto died_at = max_live_epoch(peers);
  std::printf("killed peer %zu at epoch %llu (%s), %.1f s to tear down\n", i,
              static_cast<unsigned long long>(died_at),
              at_matchmaking ? "right after it began matchmaking" : "between steps",
              std::chrono::duration<double>(Clock::now() - t0).count());
  ASSERT_TRUE(test::wait_for([&] { return min_live_epoch(peers) >= died_at + epochs; }, 180s))
      << "training stalled after peer " << i << " died at epoch " << died_at;
}

// A new peer with other initial parameters joins through the live peers, downloads the state,
// then averages with the others while the collaboration advances `epochs` epochs.
void join_and_catch_up(Peers& peers, const test::FashionSetup& s, const OptimizerOptions& o,
                       std::uint64_t model_seed, std::uint64_t data_seed, std::uint64_t epochs,
                       test::ParameterLog& log) {
  const auto at = max_live_epoch(peers);
  peers.push_back(
      std::make_unique<NetFashionPeer>(s, test::live_addresses(peers), o, model_seed, data_seed));
  auto& joiner = peers.back()->peer();
  joiner.start(UINT64_MAX, &log);
  ASSERT_TRUE(test::wait_for([&] { return joiner.downloads > 0; }, 120s))
      << "joiner never loaded state";
  const auto loaded = joiner.epoch.load();
  ASSERT_TRUE(test::wait_for(
      [&] { return min_live_epoch(peers) >= loaded + epochs && joiner.rounds > 0; }, 180s))
      << "joiner (loaded epoch " << loaded << ") did not catch up and average";
  std::printf("joiner %llu: started at epoch %llu, loaded epoch %llu, now epoch %llu, %d rounds\n",
              static_cast<unsigned long long>(data_seed), static_cast<unsigned long long>(at),
              static_cast<unsigned long long>(loaded),
              static_cast<unsigned long long>(joiner.epoch.load()), joiner.rounds.load());
}

}  // namespace

TEST(NetChurn, KilledPeersNeverStallJoinersCatchUpLivePeersAgreeEveryEpoch) {
  auto* s = test::fashion_setup();
  if (!s) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const auto o = test::net_options(512, s->batch);
  const auto t0 = Clock::now();
  test::ParameterLog log;
  Peers peers;
  peers.push_back(std::make_unique<NetFashionPeer>(*s, std::vector<net::Multiaddr>{}, o, 0, 20));
  for (int i = 1; i < 4; ++i)
    peers.push_back(std::make_unique<NetFashionPeer>(*s, peers[0]->addresses(), o, 0, 20 + i));
  for (auto& p : peers) p->peer().start(UINT64_MAX, &log);
  ASSERT_TRUE(test::wait_for([&] { return min_live_epoch(peers) >= 3; }, 180s)) << "no progress";

  // A peer dies, one joins; then the DHT's first node (everyone's bootstrap) dies, one joins.
  kill_and_continue(peers, 1, 3);
  if (HasFatalFailure()) return;
  join_and_catch_up(peers, *s, o, 99, 30, 3, log);
  if (HasFatalFailure()) return;
  kill_and_continue(peers, 0, 3);
  if (HasFatalFailure()) return;
  join_and_catch_up(peers, *s, o, 77, 31, 3, log);
  if (HasFatalFailure()) return;

  for (auto& p : peers)
    if (!p->crashed()) p->peer().stop();
  for (auto& p : peers) p->peer().join();
  const auto last = min_live_epoch(peers);
  for (auto& p : peers) EXPECT_EQ(p->peer().failures, 0);
  std::size_t checked = 0;
  EXPECT_EQ(log.disagreements(&checked), 0u) << log.disagreement_detail();
  // After every epoch (up to where all live peers got), at least two peers recorded it.
  std::size_t lonely = 0;
  {
    std::lock_guard lk(log.mu);
    for (std::uint64_t e = 1; e <= last; ++e) lonely += log.by_epoch[e].size() < 2;
  }
  EXPECT_EQ(lonely, 0u) << "epochs 1.." << last << " recorded by fewer than two peers";
  std::string coverage;
  for (auto& p : peers)
    coverage += fmt::format(" peer {}: {} epochs recorded, {} rounds, {} downloads, {} B sent;",
                            p->peer().id(), log.recorded_by(p->peer().id(), 1, last),
                            p->peer().rounds.load(), p->peer().downloads.load(), p->bytes_sent());
  std::printf("churn: epochs 1..%llu, %zu checked by >= 2 peers, %zu disagreements, %.1f s\n%s\n",
              static_cast<unsigned long long>(last), checked, log.disagreements(&checked),
              std::chrono::duration<double>(Clock::now() - t0).count(), coverage.c_str());
  // The live peers that ended at the same epoch hold identical parameters.
  std::map<std::uint64_t, std::uint64_t> hash_at;
  for (auto& p : peers) {
    if (p->crashed()) continue;
    const auto h = test::parameter_hash(*p->peer().model());
    auto [it, fresh] = hash_at.emplace(p->peer().epoch.load(), h);
    EXPECT_TRUE(fresh || it->second == h) << "peers at epoch " << it->first << " differ";
  }
}
