// Matchmaking core, the expected-size hint (MatchmakingConfig::expected_size): a leader whose
// group holds every expected peer begins at once; without the hint, short of the hint, below
// the minimum, or while an open peer of its view is still planned to join it, it waits as
// before (min_wait, then the plan). Deterministic: one core, time as a parameter.
#include <gtest/gtest.h>

#include "starling/averaging/matchmaking_core.hpp"

using namespace starling;
using namespace starling::averaging;

namespace {

using State = MatchmakingCore::State;

PeerKey pk_of(const std::string& prefix, int i) {
  return PeerKey::from_string(prefix + std::to_string(i));
}

// A name prefix under which peer 0 ranks first among peers 0..4 for the key below (found once
// by search): in every view of these tests peer 0 is the planned leader, so it waits for joins
// even when its view already shows every expected peer (then the others plan at once).
const std::string& prefix() {
  static const std::string p = [] {
    const auto key = GroupKey::initial({"m", 16, 0}, 1).value().to_string();
    for (int k = 0;; ++k) {
      const std::string s = "hint-" + std::to_string(k) + "-peer-";
      std::vector<MatchEntry> view(5);
      for (int i = 0; i < 5; ++i) {
        view[i].info.peer = pk_of(s, i);
        view[i].schema_hash = Bytes(32, 1);
        view[i].open = true;
      }
      if (plan_groups(view, key, 64, 2).at(0).front() == pk_of(s, 0)) return s;
    }
  }();
  return p;
}

PeerKey pk(int i) {
  return pk_of(prefix(), i);
}

const WallTime t0 = WallTime{} + 1h;
const Bytes schema(32, 1);

MatchmakingConfig config(std::size_t expected) {
  MatchmakingConfig cfg;
  cfg.target_group_size = 64;
  cfg.min_group_size = 2;
  cfg.settle = 300ms;
  cfg.min_wait = 800ms;
  cfg.refresh_interval = 300ms;
  cfg.expected_size = expected;
  return cfg;
}

MatchEntry entry(int i) {
  MatchEntry e;
  e.info.peer = pk(i);
  e.info.bandwidth = 1000;
  e.schema_hash = schema;
  e.deadline = t0 + 10s;
  return e;
}

JoinRequest join(int i) {
  return JoinRequest{MemberInfo{pk(i), {}, 1000, false, 1.0}, schema, "m", t0 + 10s};
}

// Peer 0 as a leader that sees peers 0..n-1 in its view (all open, none joined yet).
MatchmakingCore leader(const MatchmakingConfig& cfg, int n) {
  auto key = GroupKey::initial({"m", 16, 0}, 1).value();
  MatchmakingCore l(cfg, MemberInfo{pk(0), {}, 1000, false, 1.0}, schema, key, t0, t0 + 10s, 7);
  std::vector<MatchEntry> view;
  for (int i = 0; i < n; ++i) view.push_back(entry(i));
  l.on_view(view, t0);
  return l;
}

std::size_t begins(MatchmakingCore& l) {
  std::size_t n = 0;
  for (const auto& o : l.take_outbox()) n += std::holds_alternative<BeginMsg>(o.msg) ? 1 : 0;
  return n;
}

}  // namespace

TEST(MatchmakingHint, BeginsAtOnceWhenEveryExpectedPeerJoined) {
  auto l = leader(config(3), 3);
  EXPECT_EQ(l.on_join(join(1), t0 + 350ms).verdict, JoinVerdict::accepted);
  EXPECT_EQ(l.state(), State::leading);  // 2 of the 3 expected
  EXPECT_EQ(l.on_join(join(2), t0 + 360ms).verdict, JoinVerdict::accepted);
  EXPECT_EQ(l.state(), State::beginning);  // all 3: at once, 440 ms before min_wait
  EXPECT_EQ(begins(l), 2u);
}

TEST(MatchmakingHint, WithoutTheHintWaitsMinWait) {
  auto l = leader(config(0), 3);
  l.on_join(join(1), t0 + 350ms);
  l.on_join(join(2), t0 + 360ms);
  EXPECT_EQ(l.state(), State::leading);
  EXPECT_EQ(l.next_wakeup(t0 + 360ms), t0 + 800ms);  // min_wait
  l.tick(t0 + 799ms);
  EXPECT_EQ(l.state(), State::leading);
  EXPECT_EQ(begins(l), 0u);
  l.tick(t0 + 800ms);
  EXPECT_EQ(l.state(), State::beginning);
  EXPECT_EQ(begins(l), 2u);
}

TEST(MatchmakingHint, ShortOfTheHintWaitsMinWait) {
  auto l = leader(config(4), 4);
  l.on_join(join(1), t0 + 350ms);
  l.on_join(join(2), t0 + 360ms);
  l.tick(t0 + 700ms);
  EXPECT_EQ(l.state(), State::leading);  // 3 of 4: peer 3 may still come
  // Peer 3 is gone from the view (its entry expired): after min_wait the leader begins with 3.
  l.on_view({entry(0), entry(1), entry(2)}, t0 + 750ms);
  EXPECT_EQ(l.state(), State::leading);
  l.tick(t0 + 800ms);
  EXPECT_EQ(l.state(), State::beginning);
}

TEST(MatchmakingHint, NeverBelowTheMinimum) {
  auto cfg = config(2);
  cfg.min_group_size = 3;  // a majority of the peers expected at the epoch
  auto l = leader(cfg, 3);
  l.on_join(join(1), t0 + 350ms);
  EXPECT_EQ(l.state(), State::leading);  // 2 >= the hint, but below the minimum
  l.tick(t0 + 900ms);
  EXPECT_EQ(l.state(), State::leading);
  l.on_join(join(2), t0 + 950ms);
  EXPECT_EQ(l.state(), State::beginning);
}

// An unexpected peer joined in place of an expected one whose open entry the leader sees: the
// count is reached, but the plan still has that peer joining, so the leader waits for it.
TEST(MatchmakingHint, WaitsForAPlannedPeerOfItsView) {
  auto l = leader(config(3), 4);
  l.on_join(join(1), t0 + 350ms);
  l.on_join(join(3), t0 + 360ms);
  EXPECT_EQ(l.state(), State::leading);  // 3 members, but peer 2 is planned and open
  l.on_join(join(2), t0 + 400ms);
  EXPECT_EQ(l.state(), State::beginning);
  EXPECT_EQ(begins(l), 3u);
}

// Peer i looking, its view at `at` holding the entries of peers 0..n-1.
MatchmakingCore looking(const MatchmakingConfig& cfg, int i, int n, WallTime at) {
  auto key = GroupKey::initial({"m", 16, 0}, 1).value();
  MatchmakingCore c(cfg, MemberInfo{pk(i), {}, 1000, false, 1.0}, schema, key, t0, t0 + 10s, 7);
  std::vector<MatchEntry> view;
  for (int j = 0; j < n; ++j) view.push_back(entry(j));
  c.on_view(view, at);
  return c;
}

// The planned leader of peers 0..n-1 (each peer plans the same from the same view).
int planned_leader(int n) {
  std::vector<MatchEntry> view;
  for (int j = 0; j < n; ++j) view.push_back(entry(j));
  const auto key = GroupKey::initial({"m", 16, 0}, 1).value();
  const auto plan = plan_groups(view, key.to_string(), 64, 2);
  for (int j = 0; j < n; ++j)
    if (plan.at(0).front() == pk(j)) return j;
  return -1;
}

// With the hint, a view that shows every expected peer is complete: a peer plans (and joins
// its leader) at once instead of after settle; short of it, or without a hint, it settles.
TEST(MatchmakingHint, PlansBeforeSettleOnceEveryExpectedPeerShows) {
  const int lead = planned_leader(3);
  const int other = lead == 0 ? 1 : 0;
  auto c = looking(config(3), other, 3, t0 + 20ms);
  EXPECT_EQ(c.state(), State::joining);
  bool to_leader = false;
  for (const auto& o : c.take_outbox())
    if (std::holds_alternative<JoinRequest>(o.msg)) to_leader = o.to == pk(lead);
  EXPECT_TRUE(to_leader);

  EXPECT_EQ(looking(config(0), other, 3, t0 + 20ms).state(), State::looking);  // no hint
  auto short_of = looking(config(4), other, 3, t0 + 20ms);                     // 3 of 4 show
  EXPECT_EQ(short_of.state(), State::looking);
  // It polls the DHT faster while settling, and plans at settle as before.
  EXPECT_EQ(short_of.next_wakeup(t0 + 20ms), t0 + 20ms + kSettlePoll);
  EXPECT_TRUE(short_of.wants_view(t0 + 20ms + kSettlePoll));
  EXPECT_FALSE(looking(config(0), other, 3, t0 + 20ms).wants_view(t0 + 20ms + kSettlePoll));
  short_of.tick(t0 + 300ms);
  EXPECT_EQ(short_of.state(), State::joining);
}
