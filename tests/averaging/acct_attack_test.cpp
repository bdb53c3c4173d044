// Attacks against the accountable all-reduce (acct_sim.hpp: 7 peers, 2 attackers, one kind of
// attack at a time, every peer judging every accusation with its own BanList): each
// protocol-level cheater is banned within a bounded number of rounds, no honest peer is ever
// banned, and the honest peers hold identical results every round.
#include <gtest/gtest.h>

#include <cstdio>

#include "acct_sim.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace starling::averaging::acct;

namespace {

struct AttackRun {
  int rounds_to_ban = -1;  // rounds until every attacker is banned by every honest peer
  std::size_t honest_banned = 0;
};

// Stops one round after every attacker is banned (that round checks the group without them).
AttackRun run(sim::Attack attack, Aggregation agg, std::uint64_t seed, int max_rounds = 10) {
  sim::Group g(7, {2, 5}, attack, agg);
  TimePoint now{};
  AttackRun r;
  for (int k = 1; k <= max_rounds; ++k) {
    const auto out = g.round(seed * 1000 + static_cast<std::uint64_t>(k), now);
    for (std::size_t i = 1; i < out.outputs.size(); ++i)
      EXPECT_EQ(out.outputs[i], out.outputs[0]) << "member " << i << " differs in round " << k;
    r.honest_banned = std::max(r.honest_banned, g.honest_peers_banned());
    const bool all = g.honest_bans_of(g.peer(2).pub) == 5 && g.honest_bans_of(g.peer(5).pub) == 5;
    if (r.rounds_to_ban > 0) break;
    if (all) r.rounds_to_ban = k;
  }
  return r;
}

}  // namespace

TEST(AcctAttack, NoAttackNoBans) {
  for (auto agg : {Aggregation::centered_clip, Aggregation::mean}) {
    sim::Group g(7, {}, sim::Attack::none, agg);
    TimePoint now{};
    for (int k = 1; k <= 5; ++k) {
      const auto out = g.round(static_cast<std::uint64_t>(k), now);
      EXPECT_EQ(out.accusations, 0u) << "round " << k;
      EXPECT_EQ(out.members.size(), 7u);
    }
    EXPECT_EQ(g.honest_peers_banned(), 0u);
  }
}

TEST(AcctAttack, DifferentPartsToDifferentOwners) {
  for (std::uint64_t s = 1; s <= 3; ++s) {
    const AttackRun r = run(sim::Attack::different_parts, Aggregation::centered_clip, s, 3);
    EXPECT_EQ(r.rounds_to_ban, 1) << "seed " << s;
    EXPECT_EQ(r.honest_banned, 0u);
  }
}

TEST(AcctAttack, OwnerReturnsWrongAverage) {
  for (auto agg : {Aggregation::centered_clip, Aggregation::mean}) {
    for (std::uint64_t s = 1; s <= 3; ++s) {
      const AttackRun r = run(sim::Attack::wrong_average, agg, s);
      EXPECT_GE(r.rounds_to_ban, 1) << to_string(agg) << " seed " << s;
      EXPECT_LE(r.rounds_to_ban, 3) << to_string(agg) << " seed " << s;
      EXPECT_EQ(r.honest_banned, 0u);
    }
  }
}

TEST(AcctAttack, LyingMembersCannotFrameHonestOwners) {
  for (std::uint64_t s = 1; s <= 3; ++s) {
    const AttackRun r = run(sim::Attack::false_report, Aggregation::centered_clip, s, 3);
    EXPECT_EQ(r.rounds_to_ban, 1) << "seed " << s;  // the owners expose the liars at once
    EXPECT_EQ(r.honest_banned, 0u);
  }
}

TEST(AcctAttack, FalseAccusersAreBanned) {
  for (std::uint64_t s = 1; s <= 3; ++s) {
    const AttackRun r = run(sim::Attack::false_accusation, Aggregation::centered_clip, s, 3);
    EXPECT_EQ(r.rounds_to_ban, 1) << "seed " << s;
    EXPECT_EQ(r.honest_banned, 0u);
  }
}

TEST(AcctAttack, DifferentCommitmentsToDifferentMembers) {
  for (std::uint64_t s = 1; s <= 3; ++s) {
    const AttackRun r = run(sim::Attack::different_commitments, Aggregation::centered_clip, s, 3);
    EXPECT_EQ(r.rounds_to_ban, 1) << "seed " << s;
    EXPECT_EQ(r.honest_banned, 0u);
  }
}

TEST(AcctAttack, BannedPeersLeaveTheGroup) {
  sim::Group g(7, {2, 5}, sim::Attack::different_parts, Aggregation::centered_clip);
  TimePoint now{};
  (void)g.round(1, now);
  const auto out = g.round(2, now);
  EXPECT_EQ(out.members, (std::vector<std::uint32_t>{0, 1, 3, 4, 6}));
  EXPECT_EQ(out.accusations, 0u);
}

// The figures of docs/benchmarks.md: rounds until both attackers are banned, over 20 runs.
TEST(AcctAttack, RoundsToBan) {
  for (auto attack :
       {sim::Attack::different_parts, sim::Attack::wrong_average, sim::Attack::false_report,
        sim::Attack::false_accusation, sim::Attack::different_commitments}) {
    int worst = 0, total = 0;
    for (std::uint64_t s = 1; s <= 20; ++s) {
      const AttackRun r = run(attack, Aggregation::centered_clip, 100 + s);
      ASSERT_GE(r.rounds_to_ban, 1);
      EXPECT_EQ(r.honest_banned, 0u);
      worst = std::max(worst, r.rounds_to_ban);
      total += r.rounds_to_ban;
    }
    EXPECT_LE(worst, 3);
    std::printf("attack %s: rounds to ban mean %.2f max %d (20 runs, 7 peers, 2 attackers)\n",
                sim::to_string(attack), total / 20.0, worst);
  }
}
