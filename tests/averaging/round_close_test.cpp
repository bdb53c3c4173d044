// RoundCore and clean stream closes (on_peer_closed): a member that finished and closed is not
// a failure; one that closed before sending what others wait for is dropped at once.
#include <gtest/gtest.h>

#include "round_check.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace starling::averaging::test;

TEST(RoundClose, FinishedPeerClosingIsNotAFailure) {
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    SimOptions o;
    o.seed = seed + 5000;
    o.n = 2 + seed % 8;
    o.elems = 400 + seed * 31 % 1500;
    o.part_elems = 40 + seed % 150;
    o.clients.assign(o.n, false);
    if (o.n > 3) o.clients[seed % o.n] = true;
    o.close_when_finished = true;
    RoundSim sim(o);
    sim.run();
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto done = check_round(sim);
    EXPECT_EQ(done.size(), o.n);
    for (auto i : done) {
      EXPECT_TRUE(sim.core(i).failed().none())
          << "member " << i
          << " counts a finished peer as failed: " << sim.core(i).failed().to_string();
      EXPECT_EQ(sim.core(i).subround(), 0u) << "member " << i;
    }
  }
}

TEST(RoundClose, PeerClosingBeforeFinishingIsDroppedAtOnce) {
  int closed_while_needed = 0;
  for (std::uint64_t seed = 1; seed <= 80; ++seed) {
    SimOptions o;
    o.seed = seed + 7000;
    o.n = 3 + seed % 7;
    o.elems = 500 + seed * 17 % 1500;
    o.part_elems = 50 + seed % 120;
    o.stall_timeout = 30s;  // a close must not wait for the stall timeout
    o.close_when_finished = true;
    RoundSim sim(o);
    const auto victim = static_cast<std::uint32_t>(seed * 5 % o.n);
    sim.close_at(victim, std::chrono::microseconds(seed * 131 % 9000));
    sim.run();
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto done = check_round(sim);
    EXPECT_EQ(done.size(), o.n - 1);
    expect_all_or_nothing(sim, victim, done, o.elems);
    EXPECT_LT(sim.elapsed(), 5s) << "survivors waited for a peer that had closed";
    for (auto i : done) closed_while_needed += sim.core(i).failed().test(victim);
  }
  EXPECT_GT(closed_while_needed, 0) << "no case closed a peer that was still needed";
}
