#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "round_check.hpp"

using namespace starling;
using namespace starling::averaging;
using starling::averaging::test::RoundSim;
using starling::averaging::test::SimOptions;
using namespace starling::averaging::test;

TEST(RoundCore, ExactWeightedMeanWithoutFailures) {
  for (std::size_t n : {1, 2, 3, 5, 8, 16}) {
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      SimOptions o;
      o.n = n;
      o.seed = seed * 100 + n;
      o.elems = 1000 + seed * 777;
      o.clients.assign(n, false);
      if (n > 2) o.clients[seed % n] = true;  // one client-mode member
      RoundSim sim(o);
      sim.run();
      auto done = check_round(sim);
      ASSERT_EQ(done.size(), n);
      EXPECT_EQ(counted_anywhere(sim, 0).count(), n);
      // Without failures there is one sub-round and everyone is counted everywhere.
      for (std::uint32_t i = 0; i < n; ++i) {
        EXPECT_EQ(sim.core(i).subround(), 0u);
        for (auto c : sim.core(i).counted_elements()) EXPECT_EQ(c, o.elems);
      }
    }
  }
}

TEST(RoundCore, BitIdenticalToAnIndependentFloatSum) {
  SimOptions o;
  o.n = 6;
  o.elems = 2500;
  o.weights = {1, 2, 3, 4, 5, 6};
  RoundSim sim(o);
  sim.run();
  check_round(sim);
  // Same float arithmetic, same order: sum_j float(w_j / W) * x_j.
  for (std::size_t e = 0; e < o.elems; ++e) {
    float acc = 0;
    for (std::uint32_t j = 0; j < 6; ++j) {
      const float c = static_cast<float>(o.weights[j] / 21.0);
      acc = j == 0 ? c * sim.local(j)[e] : acc + c * sim.local(j)[e];
    }
    ASSERT_EQ(sim.output(3)[e], acc) << e;
  }
}

TEST(RoundCore, ZeroWeightsMeanEqualWeights) {
  SimOptions o;
  o.n = 4;
  o.weights = {0, 0, 0, 0};
  RoundSim sim(o);
  sim.run();
  check_round(sim);
}

TEST(RoundCore, ReduceJobsOffTheCore) {
  std::vector<float> local(10, 1.0f), out(10);
  std::vector<RoundMember> one{{{10, false}, 1.0}};
  RoundConfig cfg;
  cfg.inline_reduce = false;
  RoundCore c(one, 0, local, out, cfg, TimePoint{}, TimePoint{} + 10s);
  ASSERT_TRUE(c.start(TimePoint{}));
  EXPECT_EQ(c.status(), RoundCore::Status::running);
  auto jobs = c.take_reduce_jobs();
  ASSERT_EQ(jobs.size(), 1u);
  for (auto& j : jobs) {
    run_reduce_job(j);
    c.on_reduced(j.subround, j.part, TimePoint{});
  }
  EXPECT_EQ(c.status(), RoundCore::Status::done);
  EXPECT_EQ(out, local);
}

// No barrier between the phases: an owner reduces a part and sends it to everyone as soon as
// every sender delivered it, while its other parts are still arriving.
TEST(RoundCore, EachPartIsReducedAndSentOnceItsInputsAreIn) {
  std::vector<float> local(100, 1.0f), out(100);
  std::vector<RoundMember> ms(3, RoundMember{{10, false}, 1.0});
  RoundConfig cfg;
  cfg.part_elems = 10;
  TimePoint t0{};
  RoundCore c(ms, 0, local, out, cfg, t0, t0 + 10s);
  ASSERT_TRUE(c.start(t0));
  (void)c.take_outbox();  // this member's parts for the others
  std::vector<std::uint32_t> mine;
  for (std::uint32_t p = 0; p < c.plan().parts.size(); ++p)
    if (c.plan().parts[p].owner == 0) mine.push_back(p);
  ASSERT_GE(mine.size(), 2u);
  std::vector<float> v1(10, 2.0f), v2(10, 4.0f);
  const std::uint32_t first = mine[0], second = mine[1];
  ASSERT_TRUE(c.on_message(1, PartMsg{0, first, v1}, t0));
  EXPECT_TRUE(c.take_outbox().empty()) << "reduced before member 2's values arrived";
  ASSERT_TRUE(c.on_message(2, PartMsg{0, first, v2}, t0));
  auto sent = c.take_outbox();
  ASSERT_EQ(sent.size(), 2u);  // the result to members 1 and 2, the other parts still owed
  for (const auto& e : sent) {
    const auto* r = std::get_if<ResultMsg>(&e.msg);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->part, first);
    EXPECT_EQ(r->counted.count(), 3u);
    EXPECT_NEAR(r->data[0], (1.0f + 2.0f + 4.0f) / 3.0f, 1e-6);
  }
  EXPECT_EQ(c.phase(), "reduce-scatter");
  // Member 2 fails before sending `second`: that part is reduced without it at once.
  ASSERT_TRUE(c.on_message(1, PartMsg{0, second, v1}, t0));
  EXPECT_TRUE(c.take_outbox().empty());
  c.on_peer_failed(2, "reset", t0);
  sent = c.take_outbox();
  bool second_sent = false;
  for (const auto& e : sent)
    if (const auto* r = std::get_if<ResultMsg>(&e.msg); r && r->part == second) {
      second_sent = true;
      EXPECT_EQ(e.to, 1u);
      EXPECT_FALSE(r->counted.test(2));
      EXPECT_EQ(r->data[0], 1.5f);
    }
  EXPECT_TRUE(second_sent);
}

// A sender lost while its parts are in flight reached some owners and not others. The fin
// decision drops it from every part: those that counted it are reduced again without it.
TEST(RoundCore, LostSenderIsCountedEverywhereOrNowhere) {
  int redone = 0;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    SimOptions o;
    o.seed = seed + 500;
    o.n = 4 + seed % 3;
    o.clients.assign(o.n, false);
    const std::uint32_t victim = static_cast<std::uint32_t>(o.n - 1);
    o.clients[victim] = true;  // sends parts, owns none
    RoundSim sim(o);
    // Right after sending its parts: half of them are lost in flight.
    sim.kill_on_phase(victim, "all-gather", seed % 2 == 0);
    sim.run();
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto done = check_round(sim);
    EXPECT_EQ(done.size(), o.n - 1);
    expect_all_or_nothing(sim, victim, done, o.elems);
    if (!done.empty() && sim.core(done[0]).subround() > 0) {
      ++redone;
      EXPECT_EQ(sim.core(done[0]).counted_elements()[victim], 0u);
    }
  }
  EXPECT_GT(redone, 0) << "no case had parts that counted the lost sender";
}

// --- faults: one member lost in each phase, with and without a transport notice ---

struct FaultCase {
  const char* phase;
  bool notice;
  bool victim_client;
};

class RoundFault : public ::testing::TestWithParam<FaultCase> {};

TEST_P(RoundFault, SurvivorsFinishIdentical) {
  const auto fc = GetParam();
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    SimOptions o;
    o.n = 3 + seed % 5;
    o.seed = seed * 31;
    o.clients.assign(o.n, false);
    const std::uint32_t victim = static_cast<std::uint32_t>(seed % o.n);
    if (fc.victim_client) {
      o.clients[victim] = true;
    } else if (o.n > 3) {
      o.clients[(victim + 1) % o.n] = true;
    }
    RoundSim sim(o);
    sim.kill_on_phase(victim, fc.phase, fc.notice);
    sim.run();
    SCOPED_TRACE(std::string("phase ") + fc.phase + " seed " + std::to_string(seed) + " n " +
                 std::to_string(o.n) + " victim " + std::to_string(victim));
    ASSERT_TRUE(sim.crashed(victim));
    auto done = check_round(sim);
    EXPECT_EQ(done.size(), o.n - 1);
    // Survivors finish well within the deadline: a few stall timeouts at most.
    EXPECT_LT(sim.elapsed(), 5 * o.stall_timeout + 1s);
    if (std::string(fc.phase) == "reduce-scatter" && !fc.victim_client) {
      // An owner lost before reporting is dropped from every part.
      EXPECT_FALSE(counted_anywhere(sim, done[0]).test(victim));
    }
    expect_all_or_nothing(sim, victim, done, o.elems);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Phases, RoundFault,
    ::testing::Values(FaultCase{"reduce-scatter", true, false},
                      FaultCase{"reduce-scatter", false, false},
                      FaultCase{"all-gather", true, false}, FaultCase{"all-gather", false, false},
                      FaultCase{"fin", true, false}, FaultCase{"fin", false, false},
                      FaultCase{"all-gather", true, true}, FaultCase{"fin", false, true}),
    // Stable names: the default prints the parameter's bytes (a pointer, different on every
    // run), so ctest's discovered names would match nothing and run no test at all.
    [](const ::testing::TestParamInfo<FaultCase>& info) {
      std::string name = info.param.phase;
      for (auto& ch : name)
        if (ch == '-') ch = '_';
      name += info.param.notice ? "_notice" : "_silent";
      if (info.param.victim_client) name += "_client";
      return name;
    });

TEST(RoundCore, CrashAtRandomTimes) {
  int recovered = 0;
  for (std::uint64_t seed = 1; seed <= 150; ++seed) {
    SimOptions o;
    o.seed = seed;
    o.n = 2 + seed % 9;
    o.elems = 500 + seed * 13 % 2000;
    o.part_elems = 50 + seed % 200;
    o.clients.assign(o.n, false);
    if (o.n > 3) o.clients[seed % o.n] = true;
    RoundSim sim(o);
    const std::uint32_t victim = static_cast<std::uint32_t>((seed * 7) % o.n);
    sim.kill_at(victim, std::chrono::microseconds(seed * 97 % 12000), seed % 3 != 0);
    sim.run();
    SCOPED_TRACE("seed " + std::to_string(seed));
    // With two members, losing one leaves a lone survivor: it finishes with its own values or
    // the mean, either way alone. With more, every live member must finish.
    auto done = check_round(sim);
    EXPECT_EQ(done.size(), o.n - 1);
    expect_all_or_nothing(sim, victim, done, o.elems);
    for (auto i : done) recovered += sim.core(i).subround() > 0;
  }
  EXPECT_GT(recovered, 0) << "no case exercised a recovery sub-round";
}

TEST(RoundCore, TwoCrashesInDifferentPhases) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    SimOptions o;
    o.seed = seed + 1000;
    o.n = 6 + seed % 4;
    RoundSim sim(o);
    sim.kill_on_phase(0, "reduce-scatter", seed % 2 == 0);
    sim.kill_on_phase(static_cast<std::uint32_t>(1 + seed % (o.n - 1)), "all-gather", true);
    sim.run();
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto done = check_round(sim);
    EXPECT_EQ(done.size(), o.n - 2);
  }
}

TEST(RoundCore, MalformedSenderIsExcluded) {
  for (int kind = 0; kind < 4; ++kind) {
    SimOptions o;
    o.n = 5;
    o.seed = 77 + kind;
    RoundSim sim(o);
    const std::uint32_t bad = 2;
    bool done_once = false;
    sim.mutate = [&](std::uint32_t from, std::uint32_t, RoundMessage& m, std::vector<float>& d) {
      if (from != bad || done_once) return true;
      if (kind == 0 && std::holds_alternative<PartMsg>(m)) {
        d.pop_back();  // wrongly sized part
        std::get<PartMsg>(m).data = d;
        done_once = true;
      } else if (kind == 1 && std::holds_alternative<PartMsg>(m)) {
        d[0] = std::numeric_limits<float>::quiet_NaN();
        done_once = true;
      } else if (kind == 2 && std::holds_alternative<PartMsg>(m)) {
        std::get<PartMsg>(m).part = 100000;  // part out of range
        done_once = true;
      } else if (kind == 3 && std::holds_alternative<ResultMsg>(m)) {
        d.resize(d.size() + 3);  // wrongly sized result
        done_once = true;
      }
      return true;
    };
    sim.run();
    SCOPED_TRACE("kind " + std::to_string(kind));
    EXPECT_TRUE(done_once);
    // The bad member is excluded by its victim and, through the fin round, by the group.
    auto done = check_round(sim, false);
    EXPECT_GE(done.size(), 4u);
    for (std::uint32_t i = 0; i < 5; ++i) {
      if (i != bad) {
        EXPECT_EQ(sim.core(i).status(), RoundCore::Status::done) << i;
      }
    }
    if (kind <= 2) {
      EXPECT_FALSE(counted_anywhere(sim, done[0]).test(bad));
    }
  }
}

TEST(RoundCore, RejectsProtocolViolations) {
  std::vector<float> local(100, 1.0f), out(100);
  std::vector<RoundMember> ms(3, RoundMember{{10, false}, 1.0});
  RoundConfig cfg;
  cfg.part_elems = 10;
  TimePoint t0{};
  auto make = [&] {
    auto c = std::make_unique<RoundCore>(ms, 0, local, out, cfg, t0, t0 + 10s);
    EXPECT_TRUE(c->start(t0));
    return c;
  };
  std::vector<float> ten(10, 0.5f);
  {
    auto c = make();
    auto r = c->on_message(1, PartMsg{5, 0, ten}, t0);  // two sub-rounds ahead
    EXPECT_EQ(r.error(), errc::protocol_violation);
    EXPECT_TRUE(c->failed().test(1));
    // Fenced: later messages from 1 are ignored, not errors.
    EXPECT_TRUE(c->on_message(1, PartMsg{0, 0, ten}, t0));
  }
  {
    auto c = make();
    const auto& parts = c->plan().parts;
    std::uint32_t not_mine = 0;
    while (parts[not_mine].owner == 0) ++not_mine;
    EXPECT_EQ(c->on_message(1, PartMsg{0, not_mine, ten}, t0).error(), errc::protocol_violation);
  }
  {
    auto c = make();
    EXPECT_TRUE(c->on_message(1, PartMsg{0, 0, ten}, t0));
    EXPECT_EQ(c->on_message(1, PartMsg{0, 0, ten}, t0).error(), errc::protocol_violation);
  }
  {
    auto c = make();
    FinMsg f{0, 3, {}};
    EXPECT_EQ(c->on_message(2, f, t0).error(), errc::invalid_argument);
  }
  {
    auto c = make();
    const std::size_t np = c->plan().parts.size();
    // A fin1 that reports a part missing without reporting its owner failed.
    FinReport r{2, Bitset(np), Bitset(3), Bitset(3), Bitset(3, true)};
    r.missing.set(0);
    EXPECT_EQ(c->on_message(2, FinMsg{0, 1, {r}}, t0).error(), errc::protocol_violation);
  }
  {
    auto c = make();
    // A fin1 carrying someone else's report.
    FinReport r{1, Bitset(c->plan().parts.size()), Bitset(3), Bitset(3), Bitset(3, true)};
    EXPECT_EQ(c->on_message(2, FinMsg{0, 1, {r}}, t0).error(), errc::protocol_violation);
  }
  {
    auto c = make();
    EXPECT_FALSE(c->on_message(0, PartMsg{0, 0, ten}, t0));  // from self
    EXPECT_FALSE(c->on_message(7, PartMsg{0, 0, ten}, t0));  // unknown member
  }
}

TEST(RoundCore, DeadlineEndsTheRoundWithTimeout) {
  std::vector<float> local(100, 1.0f), out(100);
  std::vector<RoundMember> ms(3, RoundMember{{10, false}, 1.0});
  RoundConfig cfg;
  cfg.stall_timeout = 1h;
  TimePoint t0{};
  RoundCore c(ms, 0, local, out, cfg, t0, t0 + 3s);
  ASSERT_TRUE(c.start(t0));
  EXPECT_EQ(c.next_wakeup(), t0 + 3s);
  c.tick(t0 + 3s);
  ASSERT_EQ(c.status(), RoundCore::Status::failed);
  EXPECT_EQ(c.error(), errc::timeout);
}

TEST(RoundCore, StalledPeerIsDroppedAfterStallTimeout) {
  std::vector<float> local(100, 1.0f), out(100);
  std::vector<RoundMember> ms(2, RoundMember{{10, false}, 1.0});
  RoundConfig cfg;
  cfg.stall_timeout = 2s;
  TimePoint t0{};
  RoundCore c(ms, 0, local, out, cfg, t0, t0 + 60s);
  ASSERT_TRUE(c.start(t0));
  EXPECT_EQ(c.next_wakeup(), t0 + 2s);
  c.on_activity(1, t0 + 1s);  // a keepalive pushes the stall deadline
  EXPECT_EQ(c.next_wakeup(), t0 + 3s);
  c.tick(t0 + 3s);
  // Member 1 dropped: member 0 re-reduces everything alone and keeps its own values.
  ASSERT_EQ(c.status(), RoundCore::Status::done) << c.error().message();
  EXPECT_TRUE(c.failed().test(1));
  EXPECT_EQ(out, local);
}

TEST(FinDecision, ExcludesTheAbsentAndResolvesConflicts) {
  // 4 non-clients owning parts 0..3 (part p owned by member p), plus client 4.
  std::vector<PartSpec> parts{{0, 0, 10}, {1, 10, 20}, {2, 20, 30}, {3, 30, 40}};
  std::vector<bool> client{false, false, false, false, true};
  Bitset alive(5, true);
  auto rep = [&](std::uint32_t m) {
    return FinReport{m, Bitset(4), Bitset(5), Bitset(5), Bitset(5, true)};
  };
  std::vector<std::optional<FinReport>> t(5);
  for (std::uint32_t m = 0; m < 5; ++m) t[m] = rep(m);
  // Nobody lost anything.
  auto d = decide_fin(t, alive, client, parts);
  EXPECT_TRUE(d.excluded.none());
  EXPECT_TRUE(d.missing.none());
  // Member 3 crashed in all-gather: absent, and 0 and 4 lost its part.
  t[3].reset();
  t[0]->failed.set(3);
  t[0]->missing.set(3);
  t[4]->failed.set(3);
  t[4]->missing.set(3);
  d = decide_fin(t, alive, client, parts);
  EXPECT_EQ(d.excluded.indices(), std::vector<std::uint32_t>{3});
  EXPECT_EQ(d.missing.indices(), std::vector<std::uint32_t>{3});
  // Member 3 was present but accused by two others, and accused member 1 itself: 3 goes.
  t[3] = rep(3);
  t[3]->failed.set(1);
  d = decide_fin(t, alive, client, parts);
  EXPECT_EQ(d.excluded.indices(), std::vector<std::uint32_t>{3});
  EXPECT_EQ(d.missing.indices(), std::vector<std::uint32_t>{3});
  // Mutual accusation between 1 and 2, 1 blamed for malformed data: 1 goes, and the part
  // 2 lost (owned by 1) is re-reduced; the part 1 lost (owned by 2) is not.
  for (std::uint32_t m = 0; m < 5; ++m) t[m] = rep(m);
  t[1]->failed.set(2);
  t[1]->missing.set(2);
  t[2]->failed.set(1);
  t[2]->blamed.set(1);
  t[2]->missing.set(1);
  d = decide_fin(t, alive, client, parts);
  EXPECT_EQ(d.excluded.indices(), std::vector<std::uint32_t>{1});
  EXPECT_EQ(d.missing.indices(), std::vector<std::uint32_t>{1});
  // Without blame the higher index loses the tie; the decision is order-independent.
  t[2]->blamed.reset(1);
  d = decide_fin(t, alive, client, parts);
  EXPECT_EQ(d.excluded.indices(), std::vector<std::uint32_t>{2});
  EXPECT_EQ(d.missing.indices(), std::vector<std::uint32_t>{2});
  // Counted set: the intersection of the tags the remaining owners report, minus the owners
  // of missing parts. Client 4 lost mid reduce-scatter: owner 1 reduced without it.
  for (std::uint32_t m = 0; m < 5; ++m) t[m] = rep(m);
  d = decide_fin(t, alive, client, parts);
  EXPECT_EQ(d.counted.count(), 5u);
  t[4].reset();
  t[1]->failed.set(4);
  t[1]->counted.reset(4);
  d = decide_fin(t, alive, client, parts);
  EXPECT_EQ(d.excluded.indices(), std::vector<std::uint32_t>{4});
  EXPECT_TRUE(d.missing.none());
  EXPECT_EQ(d.counted.indices(), (std::vector<std::uint32_t>{0, 1, 2, 3}));
  // Owner 3 lost in all-gather after everyone counted it: its own part is missing, so it is
  // dropped from the counted set (its parts' values are gone).
  for (std::uint32_t m = 0; m < 5; ++m) t[m] = rep(m);
  t[3].reset();
  t[0]->failed.set(3);
  t[0]->missing.set(3);
  d = decide_fin(t, alive, client, parts);
  EXPECT_EQ(d.missing.indices(), std::vector<std::uint32_t>{3});
  EXPECT_EQ(d.counted.indices(), (std::vector<std::uint32_t>{0, 1, 2, 4}));
  // A client lost after delivering everything stays counted: nothing to redo.
  for (std::uint32_t m = 0; m < 5; ++m) t[m] = rep(m);
  t[4].reset();
  d = decide_fin(t, alive, client, parts);
  EXPECT_EQ(d.excluded.indices(), std::vector<std::uint32_t>{4});
  EXPECT_EQ(d.counted.count(), 5u);
  // Two clients never talk: a client "accusing" a client is no conflict.
  std::vector<bool> two_clients{false, false, false, true, true};
  for (std::uint32_t m = 0; m < 5; ++m) t[m] = rep(m);
  t[4]->failed.set(3);
  d = decide_fin(t, alive, two_clients, parts);
  EXPECT_TRUE(d.excluded.none());
}
