// Intact groups skip the DHT (AveragerConfig::reuse_group): a step that expects exactly the
// members of the last successful group matches over join streams from a predicted view, with
// no directory operation; every change (a member killed, a joiner, a peer at another round)
// falls back to the directory, and the survivors end with identical values.
#include <gtest/gtest.h>

#include <atomic>

#include "net_harness.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace starling::averaging::test;

namespace {

// A MemoryDirectory that counts the operations made through it.
class CountingDirectory final : public Directory {
 public:
  awaitable<result<void>> put(Bytes key, Bytes subkey, Bytes value, WallTime expires) override {
    ++puts;
    co_return co_await inner_.put(std::move(key), std::move(subkey), std::move(value), expires);
  }
  awaitable<result<std::vector<Bytes>>> get(Bytes key) override {
    ++gets;
    co_return co_await inner_.get(std::move(key));
  }
  std::atomic<int> puts{0}, gets{0};

 private:
  MemoryDirectory inner_;
};

StepOptions opts(const std::string& round, std::size_t expected) {
  StepOptions o;
  o.round = round;
  o.timeout = 30s;
  o.expected_group_size = expected;
  return o;
}

// Steps the nodes in `which` (each with its own options) at once; the others stay idle.
std::vector<result<StepResult>> step_some(Cluster& c, const std::vector<std::size_t>& which,
                                          const std::vector<StepOptions>& o) {
  std::vector<std::future<result<StepResult>>> fs;
  for (std::size_t k = 0; k < which.size(); ++k)
    fs.push_back(spawn_future(c.node(which[k]).io,
                              [a = c.node(which[k]).avg, so = o[k]]() { return a->step(so); }));
  std::vector<result<StepResult>> out;
  for (auto& f : fs) {
    if (f.wait_for(120s) != std::future_status::ready) throw std::runtime_error("step hung");
    out.push_back(f.get());
  }
  return out;
}

void expect_identical(Cluster& c, const std::vector<std::size_t>& which) {
  const auto first = c.flat(which.front());
  for (auto i : which) EXPECT_EQ(c.flat(i), first) << "node " << i;
}

std::vector<float> mean_of(Cluster& c, const std::vector<std::size_t>& which) {
  std::vector<float> m(c.schema().numel(), 0.0f);
  for (auto i : which) {
    const auto v = c.flat(i);
    for (std::size_t j = 0; j < m.size(); ++j) m[j] += v[j];
  }
  for (auto& x : m) x /= static_cast<float>(which.size());
  return m;
}

void expect_near(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t j = 0; j < a.size(); ++j) ASSERT_NEAR(a[j], b[j], 1e-4f) << "element " << j;
}

struct DirectMatch : ::testing::Test {
  std::shared_ptr<CountingDirectory> dir = std::make_shared<CountingDirectory>();
  Cluster make(std::size_t n) { return Cluster(n, test_schema(300), base_config(), {}, 5, dir); }
};

TEST_F(DirectMatch, AnIntactGroupMatchesWithoutTheDirectory) {
  auto c = make(4);
  const std::vector<std::size_t> all{0, 1, 2, 3};
  // The first round has no last group: the directory forms it.
  auto r = step_some(c, all, std::vector<StepOptions>(4, opts("g/1", 4)));
  for (auto& x : r) {
    ASSERT_TRUE(x) << x.error().message();
    EXPECT_FALSE(x.value().matched_directly);
  }
  EXPECT_GT(dir->puts.load(), 0);
  for (int round = 2; round <= 4; ++round) {
    const auto want = mean_of(c, all);
    const int puts = dir->puts.load(), gets = dir->gets.load();
    r = step_some(c, all, std::vector<StepOptions>(4, opts("g/" + std::to_string(round), 4)));
    for (auto& x : r) {
      ASSERT_TRUE(x) << x.error().message();
      EXPECT_TRUE(x.value().matched_directly) << "round " << round;
      EXPECT_EQ(x.value().group.members.size(), 4u);
    }
    EXPECT_EQ(dir->puts.load(), puts) << "round " << round << " wrote to the directory";
    EXPECT_EQ(dir->gets.load(), gets) << "round " << round << " read the directory";
    expect_identical(c, all);
    expect_near(c.flat(0), want);
  }
}

TEST_F(DirectMatch, WithoutTheHintOrWhenAPeerMayJoinTheDirectoryIsUsed) {
  auto c = make(3);
  const std::vector<std::size_t> all{0, 1, 2};
  ASSERT_TRUE(step_some(c, all, std::vector<StepOptions>(3, opts("g/1", 3)))[0]);
  // No expected size: nothing says the group is intact.
  auto no_hint = opts("g/2", 3);
  no_hint.expected_group_size.reset();
  const int puts = dir->puts.load();
  auto r = step_some(c, all, std::vector<StepOptions>(3, no_hint));
  for (auto& x : r) {
    ASSERT_TRUE(x) << x.error().message();
    EXPECT_FALSE(x.value().matched_directly);
  }
  EXPECT_GT(dir->puts.load(), puts);
  expect_identical(c, all);
  // The hint matches the last group, but the caller knows of a live peer outside it.
  auto outsider = opts("g/3", 3);
  outsider.reuse_group = false;
  const int puts2 = dir->puts.load();
  r = step_some(c, all, std::vector<StepOptions>(3, outsider));
  for (auto& x : r) {
    ASSERT_TRUE(x) << x.error().message();
    EXPECT_FALSE(x.value().matched_directly);
  }
  EXPECT_GT(dir->puts.load(), puts2);
  // And then the same hint with nothing against it: direct.
  r = step_some(c, all, std::vector<StepOptions>(3, opts("g/4", 3)));
  for (auto& x : r) {
    ASSERT_TRUE(x) << x.error().message();
    EXPECT_TRUE(x.value().matched_directly);
  }
  expect_identical(c, all);
}

TEST_F(DirectMatch, AKilledMemberMakesTheOthersFallBackToTheDirectory) {
  auto c = make(4);
  const std::vector<std::size_t> all{0, 1, 2, 3};
  ASSERT_TRUE(step_some(c, all, std::vector<StepOptions>(4, opts("g/1", 4)))[0]);
  ASSERT_TRUE(step_some(c, all, std::vector<StepOptions>(4, opts("g/2", 4)))[0]);
  c.kill(3);
  const std::vector<std::size_t> live{0, 1, 2};
  const auto want = mean_of(c, live);
  const int puts = dir->puts.load();
  // The callers do not know yet (they still expect 4): the group cannot form directly.
  auto o = opts("g/3", 4);
  o.min_group_size = 3;
  auto r = step_some(c, live, std::vector<StepOptions>(3, o));
  std::size_t through_directory = 0;
  for (auto& x : r) {
    ASSERT_TRUE(x) << x.error().message();
    through_directory += x.value().matched_directly ? 0 : 1;
    EXPECT_EQ(x.value().group.members.size(), 3u);
  }
  // The leader at least went back to the directory (its followers, already following it,
  // never needed to).
  EXPECT_GE(through_directory, 1u);
  EXPECT_GT(dir->puts.load(), puts);
  expect_identical(c, live);
  expect_near(c.flat(0), want);
  // The three are the new intact group.
  r = step_some(c, live, std::vector<StepOptions>(3, opts("g/4", 3)));
  for (auto& x : r) {
    ASSERT_TRUE(x) << x.error().message();
    EXPECT_TRUE(x.value().matched_directly);
  }
  expect_identical(c, live);
}

// The member every other one will ask to join next round (the leader of the plan over the
// last group, for `round`).
std::size_t predicted_leader(Cluster& c, const GroupInfo& last, const std::string& round) {
  std::vector<MatchEntry> view;
  for (const auto& m : last.members) {
    MatchEntry e;
    e.info = m;
    e.schema_hash = last.schema_hash;
    e.deadline = WallClock::now() + 1h;
    view.push_back(e);
  }
  const auto key = GroupKey::initial(base_config().key, 1).value().with_round(round).to_string();
  const auto plan = plan_groups(view, key, base_config().matchmaking.target_group_size, 2);
  for (std::size_t i = 0; i < c.size(); ++i)
    if (c.node(i).avg->self_info(0).peer == plan.at(0).front()) return i;
  throw std::runtime_error("no planned leader");
}

TEST_F(DirectMatch, ThePredictedLeaderKilledDoesNotStallTheOthers) {
  auto c = make(4);
  const std::vector<std::size_t> all{0, 1, 2, 3};
  auto r = step_some(c, all, std::vector<StepOptions>(4, opts("k/1", 4)));
  ASSERT_TRUE(r[0]) << r[0].error().message();
  const auto leader = predicted_leader(c, r[0].value().group, "k/2");
  c.kill(leader);
  std::vector<std::size_t> live;
  for (auto i : all)
    if (i != leader) live.push_back(i);
  const auto want = mean_of(c, live);
  auto o = opts("k/2", 4);  // the callers still count the dead leader
  o.min_group_size = 3;
  const int puts = dir->puts.load();
  r = step_some(c, live, std::vector<StepOptions>(3, o));
  std::size_t through_directory = 0;
  for (std::size_t k = 0; k < r.size(); ++k) {
    ASSERT_TRUE(r[k]) << "node " << live[k] << ": " << r[k].error().message();
    through_directory += r[k].value().matched_directly ? 0 : 1;
    EXPECT_EQ(r[k].value().group.members.size(), 3u);
  }
  EXPECT_GE(through_directory, 1u);
  EXPECT_GT(dir->puts.load(), puts);
  expect_identical(c, live);
  expect_near(c.flat(live[0]), want);
}

TEST_F(DirectMatch, AJoinerIsMatchedThroughTheDirectory) {
  auto c = make(4);
  const std::vector<std::size_t> three{0, 1, 2}, all{0, 1, 2, 3};
  ASSERT_TRUE(step_some(c, three, std::vector<StepOptions>(3, opts("j/1", 3)))[0]);
  ASSERT_TRUE(step_some(c, three, std::vector<StepOptions>(3, opts("j/2", 3)))[0]);
  // Node 3 joins; the callers know (they expect 4): the last group of 3 is not reused.
  const auto want = mean_of(c, all);
  auto r = step_some(c, all, std::vector<StepOptions>(4, opts("j/3", 4)));
  for (auto& x : r) {
    ASSERT_TRUE(x) << x.error().message();
    EXPECT_FALSE(x.value().matched_directly);
    EXPECT_EQ(x.value().group.members.size(), 4u);
  }
  expect_identical(c, all);
  expect_near(c.flat(0), want);
}

TEST_F(DirectMatch, APeerAtAnotherRoundIsLeftOutAndTheOthersStillAverage) {
  auto c = make(4);
  const std::vector<std::size_t> all{0, 1, 2, 3}, three{0, 1, 2};
  ASSERT_TRUE(step_some(c, all, std::vector<StepOptions>(4, opts("e/1", 4)))[0]);
  // Node 3 is one round behind and does not know it (it expects the same 4): it predicts the
  // group, but every other member's key differs. The others expect 3 (the peers at their round).
  std::vector<StepOptions> o(4, opts("e/3", 3));
  o[3] = opts("e/2", 4);
  o[3].timeout = 6s;
  auto r = step_some(c, all, o);
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(r[i]) << "node " << i << ": " << r[i].error().message();
    EXPECT_EQ(r[i].value().group.members.size(), 3u);
  }
  EXPECT_FALSE(r[3]) << "a peer alone at its round has no group";
  expect_identical(c, three);
}

}  // namespace
