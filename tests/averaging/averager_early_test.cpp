// Early matchmaking (Averager::begin() / PendingStep): the group forms before the data is
// ready, the data (tensors read at run() time, and the weight) comes late, and a member whose
// data never comes (data deadline, or cancel()) is dropped like a lost peer while the others
// finish with identical results.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>

#include "flat_steps.hpp"

using namespace starling;
using namespace starling::averaging;
using starling::averaging::test::base_config;
using starling::averaging::test::begin_on;
using starling::averaging::test::Cluster;
using starling::averaging::test::RoundStarted;

namespace {

std::future<result<StepResult>> run_on(Cluster& c, std::size_t i, std::shared_ptr<PendingStep> p,
                                       double w) {
  return test::spawn_future(c.node(i).io, [p, w]() { return p->run(w); });
}

// New values for node i's tensors (the step must average these, not the ones at begin()).
void replace_values(Cluster& c, std::size_t i, float shift) {
  auto v = c.flat(i);
  for (auto& x : v) x = x * 0.5f + shift;
  c.set_flat(i, v);
  c.node(i).initial_flat = v;
}

void expect_weighted_mean(Cluster& c, const std::vector<std::size_t>& ok,
                          const std::vector<double>& w) {
  const auto ref = c.flat(ok[0]);
  for (auto i : ok)
    ASSERT_EQ(std::memcmp(c.flat(i).data(), ref.data(), ref.size() * sizeof(float)), 0)
        << "node " << i;
  double wsum = 0;
  for (auto j : ok) wsum += w[j];
  for (std::size_t e = 0; e < ref.size(); ++e) {
    double want = 0;
    for (auto j : ok) want += w[j] / wsum * c.node(j).initial_flat[e];
    ASSERT_NEAR(ref[e], want, 2e-5 * (1 + std::abs(want))) << "element " << e;
  }
}

}  // namespace

TEST(EarlyMatchmaking, GroupFormsEarlyDataComesLate) {
  const std::size_t n = 4;
  RoundStarted started;  // before the cluster: its shutdown may still report phases into it
  Cluster c(n, test::test_schema(4000), base_config(), {}, 21);
  started.hook(c);
  StepOptions so;
  so.weight = 1.0;  // an estimate: the real weights come with the data
  so.timeout = 90s;
  so.matchmaking_timeout = 20s;
  so.data_timeout = 60s;
  std::vector<std::shared_ptr<PendingStep>> p;
  for (std::size_t i = 0; i < n; ++i) p.push_back(begin_on(c, i, so));
  // Every member is in its round before any data exists.
  ASSERT_TRUE(started.wait_for(n, 60s));
  const std::vector<double> w{1, 2, 3, 4};
  std::vector<std::future<result<StepResult>>> f(n);
  for (std::size_t i = 0; i + 1 < n; ++i) {
    replace_values(c, i, static_cast<float>(i));
    f[i] = run_on(c, i, p[i], w[i]);
  }
  // The last member's data comes once the others have sent theirs (they wait for it).
  ASSERT_EQ(f[0].wait_for(2s), std::future_status::timeout) << "finished without member 3";
  replace_values(c, n - 1, 7.0f);
  f[n - 1] = run_on(c, n - 1, p[n - 1], w[n - 1]);
  std::vector<std::size_t> ok;
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(f[i].wait_for(120s), std::future_status::ready);
    auto r = f[i].get();
    ASSERT_TRUE(r) << "node " << i << ": " << r.error().message();
    EXPECT_EQ(r.value().group.members.size(), n);
    // Every member learned every weight from the parts (all own a share here).
    for (const auto& m : r.value().contributions) {
      const auto j = r.value().group.index_of(m.peer);
      ASSERT_TRUE(j);
      const auto node = [&] {
        for (std::size_t k = 0; k < n; ++k)
          if (PeerKey(c.node(k).host->local_peer().bytes()) == m.peer) return k;
        return n;
      }();
      ASSERT_LT(node, n);
      EXPECT_EQ(m.weight, w[node]) << "node " << i << " reports member " << *j;
      EXPECT_EQ(m.counted_elements, c.schema().numel());
    }
    ok.push_back(i);
  }
  expect_weighted_mean(c, ok, w);
  // run() twice is refused; the next step works normally.
  auto again = c.node(0).run([q = p[0]]() { return q->run(1.0); });
  EXPECT_EQ(again.error(), errc::already_exists);
  StepOptions next;
  next.timeout = 60s;
  next.matchmaking_timeout = 20s;
  auto res = c.step_all(std::vector<StepOptions>(n, next));
  for (std::size_t i = 0; i < n; ++i) EXPECT_TRUE(res[i]) << res[i].error().message();
}

class EarlyNeverSupplied : public ::testing::TestWithParam<bool> {};

TEST_P(EarlyNeverSupplied, MemberIsDroppedOthersFinish) {
  const bool cancel = GetParam();
  const std::size_t n = 3;
  auto cfg = base_config();
  RoundStarted started;  // before the cluster (see above)
  Cluster c(n, test::test_schema(3000), cfg, {}, cancel ? 31 : 32);
  started.hook(c);
  const std::vector<double> w{1, 3, 5};
  auto g = c.group(w);
  std::vector<std::shared_ptr<PendingStep>> p;
  for (std::size_t i = 0; i < n; ++i) {
    StepOptions so;
    so.group = g;
    so.timeout = 90s;
    so.data_timeout = i == 2 && !cancel ? 3s : 60s;
    p.push_back(begin_on(c, i, so));
  }
  ASSERT_TRUE(started.wait_for(n, 60s));
  const auto t0 = Clock::now();
  auto f0 = run_on(c, 0, p[0], w[0]);
  auto f1 = run_on(c, 1, p[1], w[1]);
  if (cancel) {
    // Cancelled while the others wait for it.
    ASSERT_EQ(f0.wait_for(1s), std::future_status::timeout);
    c.node(2).run([q = p[2]]() -> awaitable<int> {
      q->cancel();
      co_return 0;
    });
  }
  ASSERT_EQ(f0.wait_for(120s), std::future_status::ready);
  ASSERT_EQ(f1.wait_for(120s), std::future_status::ready);
  auto r0 = f0.get(), r1 = f1.get();
  ASSERT_TRUE(r0) << r0.error().message();
  ASSERT_TRUE(r1) << r1.error().message();
  // Long before the survivors' own deadline (90 s): they stopped waiting when it left.
  EXPECT_LT(Clock::now() - t0, 60s);
  EXPECT_EQ(r0.value().contributions[2].counted_elements, 0u);
  expect_weighted_mean(c, {0, 1}, w);
  // The member that never supplied data fails and keeps its tensors.
  auto r2 = c.node(2).run([q = p[2]]() { return q->run(5.0); });
  ASSERT_FALSE(r2);
  EXPECT_EQ(r2.error(), cancel ? errc::cancelled : errc::timeout) << r2.error().message();
  EXPECT_EQ(c.flat(2), c.node(2).initial_flat);
}

INSTANTIATE_TEST_SUITE_P(DeadlineOrCancel, EarlyNeverSupplied, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Cancel" : "DataDeadline"; });

// PendingStep::cancel() during matchmaking ends the step at once (a leader disbands its
// followers, a follower leaves its leader) instead of at the matchmaking deadline; the other
// peer goes on looking. Before, a cancelled step only ended when its group formed or its
// matchmaking deadline (here 30 s) passed.
TEST(EarlyMatchmaking, CancelWhileMatchmakingEndsAtOnce) {
  auto cfg = base_config();
  cfg.matchmaking.min_wait = 40s;  // the pair waits for more peers (until the deadline)
  Cluster c(2, test::test_schema(1000), cfg, {}, 33);
  std::mutex m;
  std::condition_variable cv;
  std::set<std::size_t> paired;  // nodes leading or following
  c.on_phase = [&](std::size_t i, const std::string& ph) {
    if (ph != "matchmaking:leading" && ph != "matchmaking:following") return;
    std::lock_guard lock(m);
    paired.insert(i);
    cv.notify_all();
  };
  StepOptions so;
  so.round = "r1";
  so.weight = 1;
  so.timeout = 60s;
  so.matchmaking_timeout = 30s;
  std::vector<std::shared_ptr<PendingStep>> p{begin_on(c, 0, so), begin_on(c, 1, so)};
  {
    std::unique_lock lock(m);
    ASSERT_TRUE(cv.wait_for(lock, 30s, [&] { return paired.size() == 2; }));
  }
  for (std::size_t who = 0; who < 2; ++who) {
    const auto t0 = Clock::now();
    auto ended = c.node(who).run([q = p[who]]() -> awaitable<bool> {
      q->cancel();
      co_return co_await q->wait(Clock::now() + 10s);
    });
    EXPECT_TRUE(ended) << "node " << who << " still matchmaking 10 s after cancel()";
    EXPECT_LT(Clock::now() - t0, 5s);
    auto r = c.node(who).run([q = p[who]]() { return q->run(1.0); });
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), errc::cancelled) << r.error().message();
    if (who == 0) {
      // The other one is still looking (released or left, not failed).
      auto other = c.node(1).run([q = p[1]]() -> awaitable<bool> { co_return q->finished(); });
      EXPECT_FALSE(other);
    }
  }
}
