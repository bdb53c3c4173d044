// Steps over the caller's flat buffers (StepData): the round reads `input` and writes the
// group's average into `output` directly, with the data supplied at once (step) or after the
// group formed (begin + run: the round moves its output to the caller's buffer). The averager's
// own tensors are never read or written; sizes that do not match are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>

#include "flat_steps.hpp"

using namespace starling;
using namespace starling::averaging;
using starling::averaging::test::base_config;
using starling::averaging::test::Cluster;

using starling::averaging::test::data_of;
using starling::averaging::test::expect_mean;
using starling::averaging::test::Flat;
using starling::averaging::test::flat_for;
using starling::averaging::test::flat_options;

TEST(StepData, FlatBuffersAreAveragedInPlaceAndTheTensorsStayUntouched) {
  const std::size_t n = 3;
  Cluster c(n, test::test_schema(3000), base_config(), {}, 31);
  const std::vector<double> w{1, 2, 5};
  std::vector<std::shared_ptr<Flat>> flats;
  std::vector<std::vector<float>> before;
  std::vector<std::future<result<StepResult>>> f;
  for (std::size_t i = 0; i < n; ++i) {
    flats.push_back(flat_for(c, i));
    before.push_back(c.flat(i));
    f.push_back(test::spawn_future(
        c.node(i).io, [a = c.node(i).avg, so = flat_options(w[i]),
                       d = data_of(flats[i])]() mutable { return a->step(so, std::move(d)); }));
  }
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(f[i].wait_for(120s), std::future_status::ready);
    auto r = f[i].get();
    ASSERT_TRUE(r) << "node " << i << ": " << r.error().message();
    EXPECT_EQ(r.value().group.members.size(), n);
  }
  expect_mean(flats, w);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(c.flat(i), before[i]) << "node " << i;
}

TEST(StepData, DataThatComesAfterTheGroupFormedIsAveragedIntoTheCallersOutput) {
  const std::size_t n = 3;
  std::mutex m;  // declared before the cluster: its shutdown still reports phases
  std::condition_variable cv;
  std::set<std::size_t> in_round;
  Cluster c(n, test::test_schema(3000), base_config(), {}, 32);
  c.on_phase = [&](std::size_t i, const std::string& ph) {
    if (ph.rfind("matchmaking", 0) == 0) return;
    std::lock_guard lock(m);
    in_round.insert(i);
    cv.notify_all();
  };
  const std::vector<double> w{3, 1, 1};
  std::vector<std::shared_ptr<PendingStep>> p;
  for (std::size_t i = 0; i < n; ++i) {
    auto r = c.node(i).run(
        [a = c.node(i).avg,
         so = flat_options(1.0)]() -> awaitable<result<std::shared_ptr<PendingStep>>> {
          co_return a->begin(so);
        });
    ASSERT_TRUE(r) << r.error().message();
    p.push_back(r.value());
  }
  {
    // Every member is in its round before any data exists.
    std::unique_lock lock(m);
    ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return in_round.size() >= n; }));
  }
  std::vector<std::shared_ptr<Flat>> flats;
  std::vector<std::future<result<StepResult>>> f;
  for (std::size_t i = 0; i < n; ++i) {
    flats.push_back(flat_for(c, i));
    f.push_back(test::spawn_future(
        c.node(i).io, [q = p[i], wi = w[i], d = data_of(flats[i])]() { return q->run(wi, d); }));
  }
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(f[i].wait_for(120s), std::future_status::ready);
    auto r = f[i].get();
    ASSERT_TRUE(r) << "node " << i << ": " << r.error().message();
  }
  expect_mean(flats, w);
}

TEST(StepData, BuffersOfTheWrongSizeAreRefused) {
  Cluster c(2, test::test_schema(100), base_config(), {}, 33);
  auto small = std::make_shared<Flat>();
  small->in.assign(c.schema().numel() - 1, 1.0f);
  small->out.assign(c.schema().numel(), 0.0f);
  StepOptions so = flat_options(1.0);
  so.timeout = 5s;
  auto r = c.node(0).run(
      [a = c.node(0).avg, so, d = data_of(small)]() mutable { return a->step(so, std::move(d)); });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::invalid_argument) << r.error().message();
}

// stop() ends a step in flight at once and returns when it is over: one still matchmaking
// (nobody else steps) and one grouped whose partner's data never comes. Without it, each would
// run until its own deadline (60 s here) after the averager stopped.
TEST(AveragerStop, EndsTheStepInFlightAndWaitsForIt) {
  const std::size_t n = 2;
  // Declared before the cluster: its shutdown still reports phases.
  std::mutex m;
  std::condition_variable cv;
  std::set<std::size_t> in_round;
  Cluster c(n, test::test_schema(1000), base_config(), {}, 33);
  c.on_phase = [&](std::size_t i, const std::string& ph) {
    if (ph.rfind("matchmaking", 0) == 0) return;
    std::lock_guard lock(m);
    in_round.insert(i);
    cv.notify_all();
  };
  auto so = flat_options(1.0);
  so.min_group_size = 2;
  so.matchmaking_timeout = 60s;
  so.timeout = 120s;
  // 1. Matchmaking: node 0 alone.
  auto f0 = test::spawn_future(
      c.node(0).io,
      [a = c.node(0).avg, so, d = data_of(flat_for(c, 0))]() { return a->step(so, d); });
  ASSERT_EQ(f0.wait_for(300ms), std::future_status::timeout);  // still looking for a partner
  const auto t0 = Clock::now();
  auto stopped = c.node(0).run([a = c.node(0).avg]() -> awaitable<int> {
    co_await a->stop();
    co_return 0;
  });
  EXPECT_EQ(stopped, 0);
  EXPECT_LT(Clock::now() - t0, 5s);
  ASSERT_EQ(f0.wait_for(1s), std::future_status::ready);
  auto r0 = f0.get();
  ASSERT_FALSE(r0);
  EXPECT_EQ(r0.error(), errc::cancelled) << r0.error().message();
  // A stopped averager starts no step.
  auto again =
      c.node(0).run([a = c.node(0).avg, so]() -> awaitable<result<std::shared_ptr<PendingStep>>> {
        co_return a->begin(so);
      });
  EXPECT_EQ(again.error(), errc::closed);
}

TEST(AveragerStop, AbandonsAGroupedRoundAndWaitsForIt) {
  const std::size_t n = 2;
  // Declared before the cluster: its shutdown still reports phases.
  std::mutex m;
  std::condition_variable cv;
  std::set<std::size_t> in_round;
  Cluster c(n, test::test_schema(1000), base_config(), {}, 34);
  c.on_phase = [&](std::size_t i, const std::string& ph) {
    if (ph.rfind("matchmaking", 0) == 0) return;
    std::lock_guard lock(m);
    in_round.insert(i);
    cv.notify_all();
  };
  std::vector<std::shared_ptr<PendingStep>> p;
  for (std::size_t i = 0; i < n; ++i) {
    auto r = c.node(i).run(
        [a = c.node(i).avg,
         so = flat_options(1.0)]() -> awaitable<result<std::shared_ptr<PendingStep>>> {
          co_return a->begin(so);
        });
    ASSERT_TRUE(r) << r.error().message();
    p.push_back(r.value());
  }
  {
    std::unique_lock lock(m);
    ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return in_round.size() >= n; }));
  }
  // Node 0 supplies its data; node 1's never comes (its data deadline is 60 s away).
  auto f0 = test::spawn_future(
      c.node(0).io, [q = p[0], d = data_of(flat_for(c, 0))]() { return q->run(1.0, d); });
  ASSERT_EQ(f0.wait_for(300ms), std::future_status::timeout);
  const auto t0 = Clock::now();
  auto stopped = c.node(0).run([a = c.node(0).avg]() -> awaitable<int> {
    co_await a->stop();
    co_return 0;
  });
  EXPECT_EQ(stopped, 0);
  EXPECT_LT(Clock::now() - t0, 5s);
  ASSERT_EQ(f0.wait_for(1s), std::future_status::ready);
  auto r0 = f0.get();
  ASSERT_FALSE(r0);
  EXPECT_EQ(r0.error(), errc::cancelled) << r0.error().message();
}
