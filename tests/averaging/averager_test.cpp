// The networked Averager over real loopback Hosts (Noise + yamux), one thread per node:
// exactness for 2..16 peers (weights, mixed bandwidths, client-mode peers), matchmaking end to
// end, and fault injection (a peer killed or stalled in matchmaking, reduce-scatter and
// all-gather: the survivors finish within the deadline with identical results).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>

#include "net_harness.hpp"

using namespace starling;
using namespace starling::averaging;
using starling::averaging::test::base_config;
using starling::averaging::test::Cluster;
using starling::averaging::test::NodeOptions;

namespace {

// Checks the successful nodes: identical bytes, and the weighted mean of the initial values of
// `counted` members (all members if empty) within float rounding.
void expect_mean(Cluster& c, const std::vector<std::size_t>& ok, const std::vector<double>& w,
                 const std::vector<std::size_t>& counted) {
  ASSERT_FALSE(ok.empty());
  const auto ref = c.flat(ok[0]);
  for (auto i : ok) {
    auto f = c.flat(i);
    ASSERT_EQ(std::memcmp(f.data(), ref.data(), ref.size() * sizeof(float)), 0)
        << "node " << i << " differs from node " << ok[0];
  }
  double wsum = 0;
  for (auto j : counted) wsum += w[j];
  for (std::size_t e = 0; e < ref.size(); ++e) {
    double want = 0;
    for (auto j : counted) want += w[j] / wsum * c.node(j).initial_flat[e];
    if (std::abs(ref[e] - want) > 2e-5 * (1 + std::abs(want))) {
      ADD_FAILURE() << "element " << e << " = " << ref[e] << ", want " << want;
      return;
    }
  }
}

}  // namespace

TEST(Averager, ExactWithExplicitGroups) {
  // 2..16 peers; weights, mixed bandwidths, a client-mode peer from 3 peers on.
  for (std::size_t n : {2, 3, 5, 8, 16}) {
    if (const char* only = std::getenv("AVG_ONLY_N"); only && std::to_string(n) != only) continue;
    std::vector<NodeOptions> opts(n);
    std::vector<double> w(n);
    for (std::size_t i = 0; i < n; ++i) {
      opts[i].bandwidth = (i % 3 == 0 ? 10'000'000 : 100'000'000) + i;
      opts[i].client = n >= 3 && i == 1;
      w[i] = 1.0 + static_cast<double>(i % 4);
    }
    auto cfg = base_config();
    cfg.round.stall_timeout = 15s;  // no faults here; 16 nodes on 2 busy cores are slow
    cfg.open_timeout = 60s;
    Cluster c(n, test::test_schema(n >= 8 ? 3000 : 20000), cfg, opts, n);
    auto g = c.group(w);
    std::vector<StepOptions> so(n);
    for (std::size_t i = 0; i < n; ++i) {
      so[i].weight = w[i];
      so[i].group = g;
      so[i].timeout = 120s;
    }
    auto res = c.step_all(so);
    std::vector<std::size_t> ok, all;
    for (std::size_t i = 0; i < n; ++i) {
      all.push_back(i);
      ASSERT_TRUE(res[i]) << "n " << n << " node " << i << ": " << res[i].error().message();
      ok.push_back(i);
      EXPECT_EQ(res[i].value().subrounds, 1u);
      EXPECT_GT(res[i].value().bytes_sent, 0u);
      for (const auto& m : res[i].value().contributions)
        EXPECT_EQ(m.counted_elements, c.schema().numel());
    }
    SCOPED_TRACE("n = " + std::to_string(n));
    expect_mean(c, ok, w, all);
  }
}

TEST(Averager, MatchmakingThenAverage) {
  const std::size_t n = 6;
  Cluster c(n, test::test_schema(5000), base_config(), {}, 11);
  std::vector<StepOptions> so(n);
  std::vector<double> w(n);
  for (std::size_t i = 0; i < n; ++i) {
    w[i] = static_cast<double>(i + 1);
    so[i].weight = w[i];
    so[i].timeout = 40s;
    so[i].matchmaking_timeout = 15s;
  }
  auto res = c.step_all(so);
  std::vector<std::size_t> ok;
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(res[i]) << "node " << i << ": " << res[i].error().message();
    ok.push_back(i);
    EXPECT_EQ(res[i].value().group.members.size(), n);
    EXPECT_EQ(res[i].value().group.group_id, res[0].value().group.group_id);
  }
  expect_mean(c, ok, w, ok);
  // A second step works too (the next round proceeds normally).
  auto res2 = c.step_all(so);
  for (std::size_t i = 0; i < n; ++i) ASSERT_TRUE(res2[i]) << res2[i].error().message();
}

// AveragerConfig::client_now is asked at each step: a peer that is not publicly reachable
// (TrainingNode asks AutoNAT) joins as a client member, owning no part; once reachable again
// it owns parts in the next step. The mean is exact either way.
TEST(Averager, ClientNowIsAskedAtEachStep) {
  const std::size_t n = 3, relay_only = 2;
  auto client = std::make_shared<std::atomic<bool>>(true);
  std::vector<NodeOptions> opts(n);
  opts[relay_only].configure = [client](AveragerConfig& a) {
    a.client_now = [client] { return client->load(); };
  };
  Cluster c(n, test::test_schema(5000), base_config(), opts, 13);
  std::vector<StepOptions> so(n);
  std::vector<double> w{1, 2, 3};
  for (std::size_t i = 0; i < n; ++i) {
    so[i].weight = w[i];
    so[i].timeout = 40s;
    so[i].matchmaking_timeout = 15s;
  }
  const PeerKey key(c.node(relay_only).host->local_peer().bytes());
  for (bool as_client : {true, false}) {
    SCOPED_TRACE(as_client ? "client member" : "full member");
    client->store(as_client);
    auto res = c.step_all(so);
    std::vector<std::size_t> ok;
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(res[i]) << "node " << i << ": " << res[i].error().message();
      ok.push_back(i);
      const auto& g = res[i].value().group;
      ASSERT_EQ(g.members.size(), n);
      const auto at = g.index_of(key);
      ASSERT_TRUE(at);
      EXPECT_EQ(g.members[*at].client, as_client) << "as seen by node " << i;
      for (std::size_t j = 0; j < n; ++j) EXPECT_TRUE(j == *at || !g.members[j].client) << j;
    }
    expect_mean(c, ok, w, ok);
    for (std::size_t i = 0; i < n; ++i) c.node(i).initial_flat = c.flat(i);  // next step's input
  }
}

TEST(Averager, NoGroupEndsByTheDeadline) {
  Cluster c(1, test::test_schema(100), base_config(), {}, 3);
  StepOptions so;
  so.timeout = 6s;
  so.matchmaking_timeout = 2s;
  const auto t0 = Clock::now();
  auto res = c.step_all({so});
  ASSERT_FALSE(res[0]);
  EXPECT_EQ(res[0].error(), errc::timeout);
  EXPECT_LT(Clock::now() - t0, 4s);
  EXPECT_NE(res[0].error().message().find("no group"), std::string::npos)
      << res[0].error().message();
  // Tensors unchanged.
  EXPECT_EQ(c.flat(0), c.node(0).initial_flat);
}

// --- fault injection ---

struct Fault {
  const char* phase;  // when the victim enters this phase...
  bool stall;         // ...it stalls (thread blocked) instead of crashing
};

class AveragerFault : public ::testing::TestWithParam<Fault> {};

TEST_P(AveragerFault, SurvivorsFinishIdentical) {
  const auto f = GetParam();
  const std::size_t n = 5;
  const std::size_t victim = 2;
  std::vector<double> w{1, 2, 3, 4, 5};
  auto cfg = base_config();
  cfg.open_timeout = 6s;  // a peer stalled before we ever heard from it counts as unreachable
  Cluster c(n, test::test_schema(40000), cfg, {}, 21);
  std::atomic<bool> fired{false};
  c.on_phase = [&](std::size_t node, const std::string& ph) {
    if (node != victim || ph != f.phase || fired.exchange(true)) return;
    if (f.stall)
      c.stall(victim, 12s);
    else
      c.kill(victim);
  };
  auto g = c.group(w);
  std::vector<StepOptions> so(n);
  for (std::size_t i = 0; i < n; ++i) {
    so[i].weight = w[i];
    so[i].group = g;
    so[i].timeout = 30s;
  }
  const auto t0 = Clock::now();
  auto res = c.step_all(so);
  EXPECT_TRUE(fired.load());
  std::vector<std::size_t> ok;
  for (std::size_t i = 0; i < n; ++i) {
    if (i == victim) continue;
    ASSERT_TRUE(res[i]) << "node " << i << ": " << res[i].error().message();
    ok.push_back(i);
  }
  // Survivors finish well before the 30 s deadline: a few stall timeouts.
  for (auto i : ok) EXPECT_LT(res[i].value().total_time, 20s) << "node " << i;
  (void)t0;
  const auto ref = c.flat(ok[0]);
  for (auto i : ok) EXPECT_EQ(c.flat(i), ref) << "node " << i;
  if (std::string(f.phase) == "reduce-scatter") {
    // Lost before its report: dropped everywhere, the mean of the four others.
    std::vector<std::size_t> others{0, 1, 3, 4};
    expect_mean(c, ok, w, others);
    for (auto i : ok) EXPECT_EQ(res[i].value().contributions[victim].counted_elements, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Phases, AveragerFault,
                         ::testing::Values(Fault{"reduce-scatter", false},
                                           Fault{"all-gather", false}, Fault{"fin", false},
                                           Fault{"reduce-scatter", true},
                                           Fault{"all-gather", true}),
                         // A stable name (the default prints the parameter's raw bytes, a
                         // pointer, so ctest's discovered names went stale on rebuilds).
                         [](const ::testing::TestParamInfo<Fault>& i) {
                           std::string n =
                               std::string(i.param.stall ? "stall_" : "kill_") + i.param.phase;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

TEST(AveragerFaultMatchmaking, PeerLostWhileForming) {
  const std::size_t n = 5;
  Cluster c(n, test::test_schema(3000), base_config(), {}, 31);
  std::atomic<bool> fired{false};
  // Kill the first peer that starts following a leader or leading a group.
  std::atomic<int> victim{-1};
  c.on_phase = [&](std::size_t node, const std::string& ph) {
    if ((ph == "matchmaking:following" || ph == "matchmaking:leading") && !fired.exchange(true)) {
      victim = static_cast<int>(node);
      c.kill(node);
    }
  };
  std::vector<StepOptions> so(n);
  for (auto& o : so) {
    o.timeout = 40s;
    o.matchmaking_timeout = 10s;
  }
  auto res = c.step_all(so);
  ASSERT_TRUE(fired.load());
  std::set<Bytes> groups;
  std::size_t ok = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (static_cast<int>(i) == victim) continue;
    if (res[i]) {
      ++ok;
      groups.insert(res[i].value().group.group_id);
    } else {
      // Allowed only with a clear reason (e.g. a group of one left), never a hang.
      EXPECT_FALSE(res[i].error().context().empty());
    }
  }
  EXPECT_GE(ok, 3u);
  // Every survivor of one group holds the same values.
  for (const auto& gid : groups) {
    std::vector<float> ref;
    for (std::size_t i = 0; i < n; ++i) {
      if (static_cast<int>(i) == victim || !res[i] || res[i].value().group.group_id != gid)
        continue;
      if (ref.empty()) ref = c.flat(i);
      EXPECT_EQ(c.flat(i), ref);
    }
  }
}

TEST(Averager, BlockingStepFromTrainingThreads) {
  const std::size_t n = 3;
  Cluster c(n, test::test_schema(3000), base_config(), {}, 61);
  auto g = c.group({1, 1, 1});
  std::vector<result<StepResult>> res(n, make_error(errc::internal));
  std::vector<std::thread> ts;
  for (std::size_t i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      StepOptions o;
      o.group = g;
      o.timeout = 60s;
      res[i] = c.node(i).avg->step_blocking(o);
    });
  for (auto& t : ts) t.join();
  for (std::size_t i = 0; i < n; ++i) ASSERT_TRUE(res[i]) << res[i].error().message();
  EXPECT_EQ(c.flat(0), c.flat(2));
  // On the executor's own thread the blocking form refuses instead of deadlocking.
  auto inner = c.node(0).run([a = c.node(0).avg]() -> awaitable<result<int>> {
    auto r = a->step_blocking({});
    co_return r ? result<int>(0) : result<int>(r.error());
  });
  ASSERT_FALSE(inner);
  EXPECT_EQ(inner.error(), errc::internal);
}
