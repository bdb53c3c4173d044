// The aggregation check with CenteredClip's cut (robust.hpp, AggregationConfig::cut): members
// apply the owner's exact rule from the reports (<z, g_i - r>, |g_i - r|), so an honest owner
// that leaves far members out passes, one that keeps them (or leaves out a near one) is
// caught, a member at the edge of the taper is no edge for the check, and a radius that
// leaves out a majority is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "acct_fixture.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace starling::averaging::acct;
using namespace starling::averaging::acct::test;

namespace {

double dist(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (std::size_t j = 0; j < a.size(); ++j) {
    const double d = static_cast<double>(a[j]) - b[j];
    s += d * d;
  }
  return std::sqrt(s);
}

// 7 members: 5 honest around a centre (spread 0.5 per value) and 2 sending -10x an honest
// vector (the sign-flip attack), all with weight 1.
CheckCase sign_flip_case(std::uint64_t s, std::size_t m) {
  CheckCase c(7, m, Aggregation::centered_clip, s);
  c.g[6] = c.g[1];
  for (std::size_t i = 5; i < 7; ++i)
    for (auto& x : c.g[i]) x *= -10.0f;
  return c;
}

// The owner's result under `cfg`, sealed into the case; returns the stats.
ClipStats reduce(CheckCase& c, const AggregationConfig& cfg) {
  std::vector<std::span<const float>> in(c.g.begin(), c.g.end());
  const auto ck =
      centered_clip_checked(c.result, in, std::vector<double>(c.g.size(), 1.0), cfg, CheckConfig{});
  EXPECT_TRUE(ck.within);
  c.res.tau = ck.stats.tau;
  c.seal();
  return ck.stats;
}

AggregationConfig clip_cfg() {
  AggregationConfig cfg;
  cfg.kind = Aggregation::centered_clip;
  return cfg;
}

}  // namespace

// The honest owner's result is the known fixed point with both attackers left out (the
// CenteredClip of the 5 honest members with the same radius), and every member's check
// accepts it.
TEST(Acct, CutLeavesFarMembersOutAndHonestOwnersPass) {
  for (std::uint64_t s = 1; s <= 10; ++s) {
    auto c = sign_flip_case(s, 2000);
    const auto st = reduce(c, clip_cfg());
    EXPECT_EQ(st.dropped, 2u) << s;
    std::vector<std::span<const float>> honest(c.g.begin(), c.g.begin() + 5);
    std::vector<float> known(c.result.size());
    centered_clip_with(known, honest, std::vector<double>(5, 1.0), clip_cfg(), st.tau, 0.0);
    EXPECT_LT(dist(c.result, known), 1e-3 * st.tau) << s;
    const auto rs = c.reports();
    const auto fp = check_fixed_point(rs, true, c.res.tau, c.res.norm, CheckConfig{});
    EXPECT_TRUE(fp.ok()) << s << ": " << fp.statistic << " vs " << fp.bound;
    EXPECT_FALSE(verify_evidence(c.wrong_average(rs), {})) << s;  // a false accusation
  }
}

// An owner that keeps the far members (plain CenteredClip, each pulling by tau / 7), or that
// leaves out an honest member near the result, returns something that is not the run's fixed
// point: every member's check fails and the evidence convicts it.
TEST(Acct, OwnerKeepingFarOrDroppingNearMembersIsCaught) {
  int kept = 0, dropped = 0;
  for (std::uint64_t s = 1; s <= 10; ++s) {
    auto c = sign_flip_case(s, 2000);
    auto cfg = clip_cfg();
    cfg.cut = 0;  // keeps the attackers, clipped
    reduce(c, cfg);
    auto v = verify_evidence(c.wrong_average(c.reports()), {});
    if (v && v.value().guilty == c.f.info.members[0]) ++kept;

    // Leaves out honest member 2: its weight 0, otherwise the honest rule.
    std::vector<std::span<const float>> in(c.g.begin(), c.g.end());
    std::vector<double> w(7, 1.0);
    w[2] = 0;
    const auto st = centered_clip(c.result, in, w, clip_cfg());
    c.res.tau = st.tau;
    c.seal();
    // A near member (before the taper), whatever it weighs.
    EXPECT_LT(dist(c.g[2], c.result), 0.5 * clip_cfg().cut * st.tau);
    v = verify_evidence(c.wrong_average(c.reports()), {});
    if (v && v.value().guilty == c.f.info.members[0]) ++dropped;
  }
  EXPECT_GE(kept, 9);  // one projection catches these shifts nearly always
  EXPECT_GE(dropped, 9);
}

// A member whose distance at the result is inside the taper (its factor between 0 and tau/d):
// a reported distance that differs from the owner's by rounding moves the statistic by
// rounding, so the honest owner passes with either (a hard cut there would flip the member's
// whole pull in or out).
TEST(Acct, AMemberAtTheTaperIsNoEdgeForTheCheck) {
  CheckCase c(7, 2000, Aggregation::centered_clip, 31);
  std::mt19937_64 rng(32);
  std::normal_distribution<float> nd(0, 1);
  c.g[6] = c.g[0];
  for (auto& x : c.g[6]) x += 2.0f * nd(rng);  // about 4 x the honest distances away
  const auto st = reduce(c, clip_cfg());
  const double d = dist(c.g[6], c.result);
  const double k = clip_coef(d, st.tau, clip_cfg().cut);
  ASSERT_GT(k, 0.0);
  ASSERT_LT(k, 0.99 * st.tau / d);  // inside the taper
  auto rs = c.reports();
  EXPECT_TRUE(check_fixed_point(rs, true, c.res.tau, c.res.norm, CheckConfig{}).ok());
  for (double f : {1 - 1e-9, 1 + 1e-9}) {
    auto moved = rs;
    moved[6].dist *= f;
    const auto fp = check_fixed_point(moved, true, c.res.tau, c.res.norm, CheckConfig{});
    EXPECT_TRUE(fp.ok()) << f << ": " << fp.statistic << " vs " << fp.bound;
  }
}

// The cut may leave out a minority only. With the run's parameters an honest adaptive radius
// cannot leave out more (validate(): cut x tau_scale > 2); a checker configured with a looser
// pair still refuses such a radius, however good the statistic.
TEST(Acct, ARadiusThatLeavesOutAMajorityIsRefused) {
  std::vector<ProjectionReport> rs(7);
  for (std::size_t i = 0; i < rs.size(); ++i) {
    rs[i].dist = i < 3 ? 1.0 : 10.0;  // 4 of 7 far
    rs[i].proj = 0;
  }
  CheckConfig check;
  check.tau_scale = 0.25;  // accepts tau >= 0.125 x the median distance (10)
  check.cut = 6;
  const auto fp = check_fixed_point(rs, true, 1.5, 1.0, check);  // cut at 9: 4 members out
  EXPECT_EQ(fp.statistic, 0.0);
  EXPECT_FALSE(fp.tau_ok);
  EXPECT_FALSE(fp.ok());
  EXPECT_TRUE(check_fixed_point(rs, true, 1.7, 1.0, check).ok());  // cut at 10.2: all count
}
