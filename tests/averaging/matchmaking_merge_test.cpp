// Matchmaking core, two leaders below the minimum: peers that planned from different views can
// both lead, each with part of the peers (4 peers, minimum 3: two pairs). Without a merge both
// waited for the deadline (15 s stalls in the training bench); now the leader whose fresh view
// plans its group under the other hands its follower back and joins the other, and the other
// keeps leading. Deterministic: cores driven by hand, time as a parameter.
#include <gtest/gtest.h>

#include "starling/averaging/matchmaking_core.hpp"

using namespace starling;
using namespace starling::averaging;

namespace {

using State = MatchmakingCore::State;

PeerKey pk(int i) {
  return PeerKey::from_string("merge-peer-" + std::to_string(i));
}

const WallTime t0 = WallTime{} + 1h;
const Bytes schema(32, 1);
const GroupKey key = GroupKey::initial({"m", 16, 0}, 1).value();

MatchmakingConfig config() {
  MatchmakingConfig cfg;
  cfg.target_group_size = 64;
  cfg.min_group_size = 3;  // the majority of 4
  cfg.settle = 300ms;
  cfg.min_wait = 800ms;
  cfg.refresh_interval = 300ms;
  cfg.expected_size = 4;
  return cfg;
}

MemberInfo member(int i) {
  return MemberInfo{pk(i), {}, 1000, false, 1.0};
}

// Peer i's entry as others see it: `size` is its group (itself and followers), open as
// leaders and looking peers publish it, closed once it follows.
MatchEntry entry(int i, std::uint32_t size, bool open = true) {
  MatchEntry e;
  e.info = member(i);
  e.info.weight = 0;
  e.schema_hash = schema;
  e.deadline = t0 + 15s;
  e.group_size = size;
  e.open = open;
  return e;
}

JoinRequest join(int i) {
  return JoinRequest{member(i), schema, key.to_string(), t0 + 15s};
}

std::unique_ptr<MatchmakingCore> core(int i) {
  return std::make_unique<MatchmakingCore>(config(), member(i), schema, key, t0, t0 + 15s, 7 + i);
}

// Peers 0 and 1 lead, 2 follows 0 and 3 follows 1 (two views disagreed on the leader).
struct TwoLeaders {
  std::unique_ptr<MatchmakingCore> a = core(0), b = core(1);
  TwoLeaders() {
    EXPECT_EQ(a->on_join(join(2), t0 + 350ms).verdict, JoinVerdict::accepted);
    EXPECT_EQ(b->on_join(join(3), t0 + 350ms).verdict, JoinVerdict::accepted);
    EXPECT_EQ(a->state(), State::leading);
    EXPECT_EQ(b->state(), State::leading);
    a->take_outbox();
    b->take_outbox();
  }
  // What the next refresh shows everyone: both leaders with 2, the followers closed.
  static std::vector<MatchEntry> view() {
    return {entry(0, 2), entry(1, 2), entry(2, 1, false), entry(3, 1, false)};
  }
};

}  // namespace

TEST(MatchmakingMerge, TheLeaderPlannedUnderTheOtherGivesWayAndTheOtherKeepsLeading) {
  TwoLeaders t;
  const auto plan = plan_groups(TwoLeaders::view(), key.to_string(), 64, 3);
  ASSERT_EQ(plan.size(), 1u);  // one group of all four, led by one of the two leaders
  const bool a_leads = plan.front().front() == pk(0);
  auto& stays = a_leads ? t.a : t.b;
  auto& gives = a_leads ? t.b : t.a;
  const PeerKey stays_key = a_leads ? pk(0) : pk(1);
  const PeerKey released = a_leads ? pk(3) : pk(2);

  stays->on_view(TwoLeaders::view(), t0 + 650ms);
  gives->on_view(TwoLeaders::view(), t0 + 650ms);
  EXPECT_EQ(stays->state(), State::leading);
  EXPECT_TRUE(stays->take_outbox().empty());

  EXPECT_EQ(gives->state(), State::joining);
  bool disbanded = false, joined = false;
  for (const auto& o : gives->take_outbox()) {
    if (std::holds_alternative<DisbandMsg>(o.msg)) disbanded = o.to == released;
    if (std::holds_alternative<JoinRequest>(o.msg)) joined = o.to == stays_key;
  }
  EXPECT_TRUE(disbanded);
  EXPECT_TRUE(joined);

  // The leader that stayed takes the other leader and its released follower: a group of 4.
  const int gives_id = a_leads ? 1 : 0;
  EXPECT_EQ(stays->on_join(join(gives_id), t0 + 660ms).verdict, JoinVerdict::accepted);
  EXPECT_EQ(stays->on_join(join(a_leads ? 3 : 2), t0 + 700ms).verdict, JoinVerdict::accepted);
  EXPECT_EQ(stays->state(), State::beginning);  // all 4 expected: at once
}

// A leader at or above the minimum never gives way (the majority rule leaves no other group
// that could also reach it), and one that sees the other leader only as a lone peer (a stale
// size) keeps leading: only a view both leaders agree on moves one of them.
TEST(MatchmakingMerge, NoMergeAtTheMinimumOrOnAStaleView) {
  TwoLeaders t;
  const bool a_leads =
      plan_groups(TwoLeaders::view(), key.to_string(), 64, 3).front().front() == pk(0);
  auto& gives = a_leads ? t.b : t.a;
  const int gives_id = a_leads ? 1 : 0, other_id = a_leads ? 0 : 1;

  // Stale: the other leader still shows as a lone looking peer.
  gives->on_view({entry(other_id, 1), entry(gives_id, 2), entry(2, 1, false), entry(3, 1, false)},
                 t0 + 650ms);
  EXPECT_EQ(gives->state(), State::leading);
  EXPECT_TRUE(gives->take_outbox().empty());

  // At the minimum (another follower joined first): it keeps its group.
  EXPECT_EQ(gives->on_join(join(9), t0 + 700ms).verdict, JoinVerdict::accepted);
  gives->take_outbox();
  auto v = TwoLeaders::view();
  v.push_back(entry(9, 1, false));
  v[gives_id].group_size = 3;
  gives->on_view(v, t0 + 950ms);
  EXPECT_NE(gives->state(), State::joining);
}

// The released follower replans from its view and joins the leader that stayed.
TEST(MatchmakingMerge, TheReleasedFollowerJoinsTheLeaderThatStayed) {
  const bool a_leads =
      plan_groups(TwoLeaders::view(), key.to_string(), 64, 3).front().front() == pk(0);
  const int gives_id = a_leads ? 1 : 0, stays_id = a_leads ? 0 : 1, released_id = a_leads ? 3 : 2;
  // A follower of the leader that gives way.
  auto follower = core(released_id);
  follower->on_view({entry(gives_id, 2), entry(released_id, 1)}, t0 + 320ms);
  ASSERT_EQ(follower->state(), State::joining);
  follower->on_join_reply(pk(gives_id), JoinReply{JoinVerdict::accepted}, t0 + 330ms);
  ASSERT_EQ(follower->state(), State::following);
  follower->take_outbox();
  follower->on_message(pk(gives_id), DisbandMsg{"merging"}, t0 + 660ms);
  // Its next view: the leader that stayed (now 3 with the one that gave way) is open.
  follower->on_view({entry(stays_id, 3), entry(gives_id, 1, false), entry(released_id, 1)},
                    t0 + 700ms);
  EXPECT_EQ(follower->state(), State::joining);
  bool to_stays = false;
  for (const auto& o : follower->take_outbox())
    if (std::holds_alternative<JoinRequest>(o.msg)) to_stays = o.to == pk(stays_id);
  EXPECT_TRUE(to_stays);
}
