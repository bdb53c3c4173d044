// Round latency: steps over the caller's buffers run back to back with exact results and the
// round's time line filled; a member still computing learns when another member's data has
// arrived (PendingStep::on_peer_data), so it can supply its own then. Results stay
// bit-identical and correct.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <set>

#include "flat_steps.hpp"

using namespace starling;
using namespace starling::averaging;
using starling::averaging::test::base_config;
using starling::averaging::test::begin_on;
using starling::averaging::test::Cluster;
using starling::averaging::test::RoundStarted;

using starling::averaging::test::data_of;
using starling::averaging::test::expect_mean;
using starling::averaging::test::Flat;
using starling::averaging::test::flat_for;
using starling::averaging::test::flat_options;

namespace {

// One step on every node over fresh caller buffers; returns the results (asserted ok).
std::vector<StepResult> step_flat(Cluster& c, const std::vector<double>& w, float shift,
                                  std::vector<std::shared_ptr<Flat>>& flats) {
  std::vector<std::future<result<StepResult>>> f;
  flats.clear();
  for (std::size_t i = 0; i < c.size(); ++i) {
    flats.push_back(flat_for(c, i, shift));
    f.push_back(test::spawn_future(
        c.node(i).io, [a = c.node(i).avg, so = flat_options(w[i]),
                       d = data_of(flats[i])]() mutable { return a->step(so, std::move(d)); }));
  }
  std::vector<StepResult> out;
  for (std::size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(f[i].wait_for(120s), std::future_status::ready);
    auto r = f[i].get();
    EXPECT_TRUE(r) << "node " << i << ": " << (r ? "" : r.error().message());
    if (r) out.push_back(std::move(r).value());
  }
  return out;
}

}  // namespace

TEST(RoundLatency, BackToBackStepsOverTheCallersBuffersAreExact) {
  const std::size_t n = 3;
  Cluster c(n, test::test_schema(3000), base_config(), {}, 41);
  const std::vector<double> w{1, 2, 4};
  std::vector<std::shared_ptr<Flat>> flats;
  // Back to back: the next step begins as soon as the last one returned.
  for (int round = 0; round < 3; ++round) {
    auto res = step_flat(c, w, static_cast<float>(round), flats);
    ASSERT_EQ(res.size(), n);
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_GT(res[i].exchange_time, Duration::zero());
    }
    expect_mean(flats, w);
  }
}

TEST(RoundLatency, ACompressedRoundOverTheCallersBuffersIsIdenticalOnBothMembers) {
  const std::size_t n = 2;
  auto schema = test::test_schema(3000);
  schema.codec = "float16";
  Cluster c(n, schema, base_config(), {}, 42);
  std::vector<std::shared_ptr<Flat>> flats;
  auto res = step_flat(c, {1, 1}, 0.0f, flats);
  ASSERT_EQ(res.size(), n);
  ASSERT_EQ(
      std::memcmp(flats[0]->out.data(), flats[1]->out.data(), flats[0]->out.size() * sizeof(float)),
      0);
}

TEST(RoundLatency, AMembersDataTellsTheMembersStillComputing) {
  const std::size_t n = 3;
  RoundStarted started;  // before the cluster: its shutdown still reports phases
  std::mutex m;
  std::condition_variable cv;
  std::set<std::size_t> told;
  Cluster c(n, test::test_schema(3000), base_config(), {}, 43);
  started.hook(c);
  std::vector<std::shared_ptr<PendingStep>> p;
  for (std::size_t i = 0; i < n; ++i) {
    p.push_back(begin_on(c, i, flat_options(1.0)));
    auto hooked = c.node(i).run([&, i, step = p.back()]() -> awaitable<result<void>> {
      step->on_peer_data([&, i] {
        std::lock_guard lock(m);
        told.insert(i);
        cv.notify_all();
      });
      co_return success();
    });
    ASSERT_TRUE(hooked);
  }
  ASSERT_TRUE(started.wait_for(n, 60s));
  {
    std::lock_guard lock(m);
    EXPECT_TRUE(told.empty()) << "told before anyone had data";
  }
  const std::vector<double> w{2, 1, 1};
  std::vector<std::shared_ptr<Flat>> flats;
  for (std::size_t i = 0; i < n; ++i) flats.push_back(flat_for(c, i, 0.0f));
  std::vector<std::future<result<StepResult>>> f(n);
  auto run = [&](std::size_t i) {
    f[i] = test::spawn_future(
        c.node(i).io, [q = p[i], wi = w[i], d = data_of(flats[i])]() { return q->run(wi, d); });
  };
  run(0);
  {
    // Members 1 and 2 learn that member 0's data is there before they supply theirs.
    std::unique_lock lock(m);
    ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return told.size() >= 2; }));
    EXPECT_FALSE(told.contains(0)) << "member 0 had its own data first";
  }
  EXPECT_FALSE(p[0]->peer_data());
  EXPECT_TRUE(p[1]->peer_data());
  EXPECT_TRUE(p[2]->peer_data());
  run(1);
  run(2);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(f[i].wait_for(120s), std::future_status::ready);
    auto r = f[i].get();
    ASSERT_TRUE(r) << "node " << i << ": " << r.error().message();
  }
  expect_mean(flats, w);
}
