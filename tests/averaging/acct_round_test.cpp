// Accountability in the networked round (AccountabilityConfig, docs/security.md): 5 averagers
// on loopback with matchmaking over a shared directory, one of them cheating in a way only the
// accountability protocol catches (CenteredClip cannot: a wrong average poisons its own part,
// different parts to different owners look like honest values to each), or lying in its
// projection reports to get the honest owners banned. Every honest peer bans the cheater, no
// honest peer is banned, the next round forms without it and the honest peers' results are
// identical.
#include <gtest/gtest.h>

#include <cstring>

#include "averaging/round_runner.hpp"
#include "net_harness.hpp"
#include "starling/averaging/accountability.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace std::chrono_literals;

namespace {

using Attack = AccountabilityConfig::Attack;
constexpr std::size_t kPeers = 5;
constexpr std::size_t kCheater = kPeers - 1;

AveragerConfig acct_config(Duration grace = 0s) {
  auto cfg = test::base_config();
  cfg.key = {"acct", 16, 0};
  cfg.round.stall_timeout = 10s;
  cfg.round.aggregation.kind = Aggregation::centered_clip;
  cfg.accountability.enabled = true;
  cfg.accountability.run = "acct-test";
  // A wrong_average verdict waits this long for the owner's false_report answer.
  cfg.accountability.grace = grace;
  return cfg;
}

std::vector<test::NodeOptions> with_attack(Attack attack) {
  std::vector<test::NodeOptions> o(kPeers);
  if (attack != Attack::none)
    o[kCheater].configure = [attack](AveragerConfig& c) { c.accountability.attack = attack; };
  return o;
}

acct::PubKey key_of_node(test::Cluster& c, std::size_t i) {
  return *acct::key_of_peer(c.node(i).host->local_peer());
}

// Steps every node with matchmaking for round `name`; `expected`: the honest group's size.
std::vector<result<StepResult>> step_round(test::Cluster& c, const std::string& name,
                                           std::size_t expected) {
  std::vector<StepOptions> so(c.size());
  for (auto& o : so) {
    o.round = name;
    o.timeout = 60s;
    o.matchmaking_timeout = 8s;
    o.expected_group_size = expected;
    o.reuse_group = false;
  }
  return c.step_all(so);
}

// Honest nodes that ban `k`, and honest nodes banned by any honest node.
std::size_t honest_bans_of(test::Cluster& c, const acct::PubKey& k) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < kCheater; ++i) n += c.node(i).avg->bans()->banned(k) ? 1 : 0;
  return n;
}
std::size_t honest_banned(test::Cluster& c) {
  std::size_t n = 0;
  for (std::size_t j = 0; j < kCheater; ++j) n += honest_bans_of(c, key_of_node(c, j)) ? 1 : 0;
  return n;
}

void expect_identical_honest(test::Cluster& c, const std::vector<result<StepResult>>& res) {
  std::vector<float> first;
  for (std::size_t i = 0; i < kCheater; ++i) {
    ASSERT_TRUE(res[i]) << "node " << i << ": " << res[i].error().message();
    auto f = c.flat(i);
    if (first.empty()) first = f;
    EXPECT_EQ(std::memcmp(f.data(), first.data(), f.size() * sizeof(float)), 0) << "node " << i;
  }
}

// Reads the accusations on every honest node until all ban `k` and no verdict is pending
// (answered, or banned after the grace) (bounded).
void poll_until_banned(test::Cluster& c, const acct::PubKey& k) {
  const TimePoint until = Clock::now() + 30s;
  auto pending = [&c] {
    std::size_t n = 0;
    for (std::size_t i = 0; i < kCheater; ++i) n += c.node(i).avg->bans()->pending();
    return n;
  };
  while ((honest_bans_of(c, k) < kCheater || pending() > 0) && Clock::now() < until)
    for (std::size_t i = 0; i < kCheater; ++i)
      c.node(i).run([a = c.node(i).avg]() -> awaitable<int> {
        co_await a->poll_accusations();
        co_return 0;
      });
}

}  // namespace

TEST(AcctRound, HonestRoundsPassTheCheck) {
  test::Cluster c(kPeers, test::test_schema(3000), acct_config(), with_attack(Attack::none), 3);
  for (int r = 0; r < 2; ++r) {
    auto res = step_round(c, "honest/" + std::to_string(r), kPeers);
    expect_identical_honest(c, res);
    for (std::size_t i = 0; i < kPeers; ++i) {
      ASSERT_TRUE(res[i]) << res[i].error().message();
      EXPECT_EQ(res[i].value().group.members.size(), kPeers);
      EXPECT_GT(res[i].value().checked_parts, 0u) << "node " << i;
      EXPECT_EQ(res[i].value().evidence_found, 0u) << "node " << i;
    }
  }
  for (std::size_t i = 0; i < kPeers; ++i) EXPECT_TRUE(c.node(i).avg->bans()->bans().empty());
}

class AcctRoundAttack : public ::testing::TestWithParam<Attack> {};

TEST_P(AcctRoundAttack, CheaterBannedAndLeftOut) {
  const Attack attack = GetParam();
  test::Cluster c(kPeers, test::test_schema(3000), acct_config(3s), with_attack(attack), 7);
  const auto cheater = key_of_node(c, kCheater);

  // Round 1: the cheater is in the group and caught.
  auto r1 = step_round(c, "attack/1", kPeers);
  for (std::size_t i = 0; i < kCheater; ++i)
    ASSERT_TRUE(r1[i]) << "node " << i << ": " << r1[i].error().message();
  std::size_t found = 0;
  for (std::size_t i = 0; i < kCheater; ++i) found += r1[i].value().evidence_found;
  EXPECT_GT(found, 0u);
  expect_identical_honest(c, r1);
  poll_until_banned(c, cheater);
  EXPECT_EQ(honest_bans_of(c, cheater), kCheater);
  EXPECT_EQ(honest_banned(c), 0u);

  // Round 2: matchmaking leaves the cheater out; the honest peers agree.
  auto r2 = step_round(c, "attack/2", kCheater);
  expect_identical_honest(c, r2);
  for (std::size_t i = 0; i < kCheater; ++i) {
    ASSERT_TRUE(r2[i]);
    EXPECT_EQ(r2[i].value().group.members.size(), kCheater);
    EXPECT_EQ(r2[i].value().evidence_found, 0u);
    for (const auto& m : r2[i].value().group.members) EXPECT_FALSE(c.node(i).avg->banned(m.peer));
  }
  EXPECT_FALSE(r2[kCheater]) << "the cheater found no group";
  EXPECT_EQ(honest_banned(c), 0u);
}

INSTANTIATE_TEST_SUITE_P(Attacks, AcctRoundAttack,
                         ::testing::Values(Attack::wrong_average, Attack::different_parts,
                                           Attack::false_report),
                         [](const auto& info) {
                           switch (info.param) {
                             case Attack::wrong_average:
                               return "wrong_average";
                             case Attack::different_parts:
                               return "different_parts";
                             default:
                               return "false_report";
                           }
                         });

// A member that reports honestly in the round but publishes, for every part another member
// owns, a wrong_average accusation built from a lying report of its own (the owners never see
// it in the round, so never answer it). Every honest peer reads the accusations (each
// verifies), yet none suspects or bans an honest owner (one member of five is a minority;
// with grace 0 a pending verdict would be a ban at the next read). The honest members hold
// the liar's in-round reports: each accusation carries another report of it for the same
// part (report_conflict evidence), so every honest peer bans the liar, and the next round
// forms without it.
TEST(AcctRound, DirectoryLiarGetsNoHonestOwnerBanned) {
  test::Cluster c(kPeers, test::test_schema(3000), acct_config(0s),
                  with_attack(Attack::directory_lie), 17);
  auto r1 = step_round(c, "dirlie/1", kPeers);
  expect_identical_honest(c, r1);
  // Read until every honest peer banned the liar (its accusations read, some owner voted
  // against, and its other report found), then once more for the rest.
  const auto liar = key_of_node(c, kCheater);
  const TimePoint until = Clock::now() + 30s;
  for (int extra = 1; extra >= 0 && Clock::now() < until;) {
    if (honest_bans_of(c, liar) == kCheater) --extra;
    for (std::size_t i = 0; i < kCheater; ++i)
      c.node(i).run([a = c.node(i).avg]() -> awaitable<int> {
        co_await a->poll_accusations();
        co_return 0;
      });
  }
  ASSERT_EQ(honest_bans_of(c, liar), kCheater) << "report_conflict against the liar";
  EXPECT_EQ(honest_banned(c), 0u);
  for (std::size_t i = 0; i < kCheater; ++i) {
    EXPECT_EQ(c.node(i).avg->bans()->pending(), 0u) << "node " << i;
    for (std::size_t j = 0; j < kCheater; ++j)
      EXPECT_FALSE(c.node(i).avg->bans()->suspected(key_of_node(c, j)))
          << "node " << i << " suspects " << j;
  }
  auto r2 = step_round(c, "dirlie/2", kCheater);
  expect_identical_honest(c, r2);
  for (std::size_t i = 0; i < kCheater; ++i)
    EXPECT_EQ(r2[i].value().group.members.size(), kCheater) << "node " << i;
  EXPECT_EQ(honest_banned(c), 0u);
}

// A member that joins and then sends nothing (AveragerConfig::test_stall: its hellos, no
// parts, results or keepalives): the others drop it once it is silent for stall_timeout and
// finish the round without it, their results identical and its values counted nowhere.
TEST(AcctRound, StallerIsDroppedAndTheRoundFinishes) {
  auto cfg = test::base_config();
  cfg.key = {"stall", 16, 0};
  cfg.round.stall_timeout = 2s;
  std::vector<test::NodeOptions> o(kPeers);
  o[kCheater].configure = [](AveragerConfig& c) { c.test_stall = true; };
  test::Cluster c(kPeers, test::test_schema(3000), cfg, o, 11);
  auto res = step_round(c, "stall/1", kPeers);
  expect_identical_honest(c, res);
  const auto staller = c.node(kCheater).host->local_peer();
  for (std::size_t i = 0; i < kCheater; ++i) {
    ASSERT_TRUE(res[i]) << res[i].error().message();
    EXPECT_EQ(res[i].value().group.members.size(), kPeers) << "the staller joined the group";
    // Dropped after the stall timeout (2 s), long before the step's 60 s deadline.
    EXPECT_LT(res[i].value().allreduce_time, 20s) << "node " << i;
    EXPECT_GT(res[i].value().subrounds, 1u) << "its part was re-reduced without it";
    for (const auto& m : res[i].value().contributions) {
      auto id = net::PeerId::from_bytes(m.peer.bytes());
      ASSERT_TRUE(id);
      if (id.value() == staller)
        EXPECT_EQ(m.counted_elements, 0u) << "node " << i;
      else
        EXPECT_GT(m.counted_elements, 0u) << "node " << i;
    }
  }
}

// Lying reports with parts whose values exceed one piece of evidence (2 x 72k floats, over
// kPieceBytes): the owners' answers travel in several pieces, reassembled by every member,
// and the liar, not an owner, is banned (published detached to the directory as well).
TEST(AcctRound, FalseReportAnsweredInPieces) {
  const auto schema = test::test_schema(120000);
  std::size_t floats = 0;
  for (const auto& t : schema.tensors) {
    std::size_t n = 1;
    for (auto d : t.shape) n *= static_cast<std::size_t>(d);
    floats += n;
  }
  ASSERT_GT(2 * (floats / kPeers) * sizeof(float), detail::kPieceBytes);
  test::Cluster c(kPeers, schema, acct_config(3s), with_attack(Attack::false_report), 13);
  const auto cheater = key_of_node(c, kCheater);
  auto r1 = step_round(c, "pieces/1", kPeers);
  expect_identical_honest(c, r1);
  poll_until_banned(c, cheater);
  EXPECT_EQ(honest_bans_of(c, cheater), kCheater);
  EXPECT_EQ(honest_banned(c), 0u);
}
