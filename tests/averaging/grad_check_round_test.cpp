// The gradient check's share of the networked round (grad_check.hpp, round_runner_grad.cpp):
// with every member drawn, each member's StepResult holds every other member's values on the
// parts it owns, exactly as that member sent them, with its declared weight; together with the
// target's own parts they cover the target's whole vector. Without the check: nothing.
#include <gtest/gtest.h>

#include <algorithm>

#include "net_harness.hpp"
#include "starling/averaging/grad_check.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kPeers = 4;

AveragerConfig config(std::uint32_t targets) {
  auto cfg = test::base_config();
  cfg.key = {"gcheck", 16, 0};
  cfg.round.stall_timeout = 10s;
  cfg.round.aggregation.kind = Aggregation::centered_clip;
  cfg.accountability.enabled = true;
  cfg.accountability.run = "gcheck-test";
  cfg.accountability.grad_check_targets = targets;
  return cfg;
}

std::vector<result<StepResult>> step(test::Cluster& c, const std::string& name) {
  std::vector<StepOptions> so(c.size());
  for (std::size_t i = 0; i < so.size(); ++i) {
    so[i].round = name;
    so[i].timeout = 60s;
    so[i].matchmaking_timeout = 8s;
    so[i].expected_group_size = kPeers;
    so[i].reuse_group = false;
    so[i].weight = 10.0 * static_cast<double>(i + 1);
  }
  return c.step_all(so);
}

}  // namespace

TEST(GradCheckRound, OwnersHandOverEveryTargetsValuesAsSent) {
  test::Cluster c(kPeers, test::test_schema(3000), config(kPeers), {}, 5);
  auto res = step(c, "gcheck/1");
  const std::size_t n = c.node(0).initial_flat.size();
  for (std::size_t t = 0; t < kPeers; ++t) {
    const PeerKey key(c.node(t).host->local_peer().bytes());
    std::vector<bool> covered(n, false);
    std::size_t holders = 0;
    for (std::size_t i = 0; i < kPeers; ++i) {
      ASSERT_TRUE(res[i]) << res[i].error().message();
      for (const auto& s : res[i].value().grad_samples) {
        EXPECT_NE(s.peer, PeerKey(c.node(i).host->local_peer().bytes())) << "checks itself";
        if (s.peer != key) continue;
        ++holders;
        EXPECT_EQ(s.weight, 10.0 * static_cast<double>(t + 1));
        EXPECT_EQ(s.median_weight, 30.0);  // of 10, 20, 30, 40: the upper middle
        for (const auto& sl : s.slices) {
          ASSERT_LE(sl.offset + sl.values.size(), n);
          EXPECT_TRUE(std::equal(sl.values.begin(), sl.values.end(),
                                 c.node(t).initial_flat.begin() + sl.offset))
              << "target " << t << " at " << sl.offset;
          for (std::size_t k = 0; k < sl.values.size(); ++k) covered[sl.offset + k] = true;
        }
      }
    }
    EXPECT_EQ(holders, kPeers - 1) << "target " << t;
    // What the others hold plus the target's own share is the whole vector.
    const auto own = std::count(covered.begin(), covered.end(), false);
    EXPECT_GT(own, 0);
    EXPECT_LT(static_cast<std::size_t>(own), n / 2) << "target " << t;
  }
}

TEST(GradCheckRound, NothingWithoutTheCheck) {
  test::Cluster c(kPeers, test::test_schema(3000), config(0), {}, 6);
  auto res = step(c, "gcheck/off");
  for (std::size_t i = 0; i < kPeers; ++i) {
    ASSERT_TRUE(res[i]) << res[i].error().message();
    EXPECT_TRUE(res[i].value().grad_samples.empty());
    EXPECT_GT(res[i].value().checked_parts, 0u);
  }
}
