// CenteredClip (robust.hpp) and ButterflyClip through the round core: equal to the mean when
// every member is within tau, one attacker's influence bounded by w_a tau / W_honest while
// the plain mean is destroyed, weight caps, degenerate inputs, and members holding
// bit-identical results with attackers in the group.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "round_check.hpp"
#include "starling/averaging/robust.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace starling::averaging::test;

namespace {

std::vector<std::span<const float>> spans(const std::vector<std::vector<float>>& v) {
  std::vector<std::span<const float>> out;
  for (const auto& x : v) out.emplace_back(x);
  return out;
}

double dist(std::span<const float> a, std::span<const double> b) {
  double s = 0;
  for (std::size_t j = 0; j < a.size(); ++j) s += (a[j] - b[j]) * (a[j] - b[j]);
  return std::sqrt(s);
}

// k honest vectors around a common centre (spread `noise`), weights w.
std::vector<std::vector<float>> honest(std::size_t k, std::size_t m, float noise,
                                       std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> centre(0.0f, 1.0f), jitter(0.0f, noise);
  std::vector<float> c(m);
  for (auto& x : c) x = centre(rng);
  std::vector<std::vector<float>> out(k, c);
  for (auto& v : out)
    for (auto& x : v) x += jitter(rng);
  return out;
}

std::vector<double> weighted_mean(const std::vector<std::vector<float>>& v,
                                  const std::vector<double>& w, std::size_t count) {
  std::vector<double> out(v[0].size(), 0.0);
  double total = 0;
  for (std::size_t i = 0; i < count; ++i) total += w[i];
  for (std::size_t i = 0; i < count; ++i)
    for (std::size_t j = 0; j < out.size(); ++j) out[j] += w[i] / total * v[i][j];
  return out;
}

}  // namespace

TEST(CenteredClip, EqualsTheWeightedMeanWhenEveryMemberIsWithinTau) {
  auto v = honest(5, 300, 0.1f, 1);
  std::vector<double> w = {1, 2, 1.5, 1, 2};
  AggregationConfig cfg;
  cfg.kind = Aggregation::centered_clip;
  cfg.tau = 1e6;             // nobody clipped
  cfg.max_weight_ratio = 0;  // the weights as given
  cfg.tolerance = 1e-9;
  std::vector<float> out(300);
  auto st = centered_clip(out, spans(v), w, cfg);
  EXPECT_EQ(st.clipped, 0u);
  auto mean = weighted_mean(v, w, 5);
  EXPECT_LT(dist(out, mean), 1e-4);
}

TEST(CenteredClip, OneAttackerMovesTheResultByAtMostItsClippedPull) {
  for (float scale : {-10.0f, 100.0f, 1e4f}) {
    auto v = honest(7, 500, 0.05f, 2);
    std::vector<double> w(8, 1.0);
    // The attacker: a scaled (or reversed) copy of an honest vector.
    std::vector<float> bad = v[0];
    for (auto& x : bad) x *= scale;
    v.push_back(bad);
    const auto honest_mean = weighted_mean(v, w, 7);
    AggregationConfig cfg;
    cfg.kind = Aggregation::centered_clip;
    cfg.tolerance = 1e-9;
    cfg.max_iterations = 200;
    cfg.cut = 0;  // the clipped pull itself (the cut removes it: FarMembersCountZeroBeyondTheCut)
    std::vector<float> out(500);
    auto st = centered_clip(out, spans(v), w, cfg);
    // Fixed point: W_h (mean_h - v) = -w_a clip(g_a - v) as long as no honest member is
    // clipped, so |v - mean_h| <= w_a tau / W_h.
    for (std::size_t i = 0; i < 7; ++i)
      ASSERT_LT(dist(v[i], std::vector<double>(out.begin(), out.end())), st.tau) << i;
    const double bound = 1.0 * st.tau / 7.0;
    EXPECT_LE(dist(out, honest_mean), 1.01 * bound + 1e-6) << "scale " << scale;
    // The plain mean is moved by |bad - mean_h| / 8.
    std::vector<float> plain(500);
    ReduceJob job;
    job.out = plain;
    job.inputs = spans(v);
    job.coeffs.assign(8, 1.0f / 8);
    run_reduce_job(job);
    EXPECT_GT(dist(plain, honest_mean), 10 * dist(out, honest_mean)) << "scale " << scale;
  }
}

TEST(CenteredClip, ClaimedSamplesAreCapped) {
  auto v = honest(5, 200, 0.05f, 3);
  std::vector<float> bad(200, 50.0f);
  v.push_back(bad);
  std::vector<double> w = {100, 120, 90, 110, 100, 1e9};  // the attacker claims 1e9 samples
  const auto capped = cap_weights(w, 2.0);
  EXPECT_DOUBLE_EQ(capped[5], 2.0 * 105.0);  // 2 x the median of the six
  EXPECT_DOUBLE_EQ(capped[0], 100.0);
  AggregationConfig cfg;
  cfg.kind = Aggregation::centered_clip;
  cfg.max_weight_ratio = 2.0;
  std::vector<float> out(200);
  auto st = centered_clip(out, spans(v), w, cfg);
  const auto honest_mean = weighted_mean(v, w, 5);
  double wh = 0;
  for (int i = 0; i < 5; ++i) wh += w[i];
  EXPECT_LE(dist(out, honest_mean), 1.05 * capped[5] * st.tau / wh + 1e-4);
  EXPECT_EQ(cap_weights(w, 0), w);  // no cap
}

TEST(CenteredClip, DegenerateInputs) {
  std::vector<std::vector<float>> one = {{1.0f, -2.0f, 3.0f}};
  std::vector<float> out(3);
  std::vector<double> w = {0.0};
  AggregationConfig cfg;
  cfg.kind = Aggregation::centered_clip;
  centered_clip(out, spans(one), w, cfg);
  EXPECT_EQ(out, one[0]);
  // All weights zero: equal weights; identical inputs stay put.
  std::vector<std::vector<float>> same(4, std::vector<float>{0.5f, 0.25f});
  std::vector<float> o2(2);
  std::vector<double> zeros(4, 0.0);
  auto st = centered_clip(o2, spans(same), zeros, cfg);
  EXPECT_EQ(o2, same[0]);
  EXPECT_EQ(st.tau, 0.0);
  // No inputs: zeros.
  std::vector<float> o3(2, 7.0f);
  centered_clip(o3, {}, {}, cfg);
  EXPECT_EQ(o3, (std::vector<float>{0, 0}));
  // Medians: odd and even counts.
  std::vector<std::vector<float>> m = {{1}, {5}, {3}, {100}};
  std::vector<double> med(1);
  coordinate_median(med, spans(m));
  EXPECT_DOUBLE_EQ(med[0], 4.0);
  m.pop_back();
  coordinate_median(med, spans(m));
  EXPECT_DOUBLE_EQ(med[0], 3.0);
}

TEST(CenteredClip, ConfigurationIsValidated) {
  EXPECT_EQ(parse_aggregation("centered-clip").value(), Aggregation::centered_clip);
  EXPECT_EQ(parse_aggregation("mean").value(), Aggregation::mean);
  EXPECT_FALSE(parse_aggregation("median"));
  AggregationConfig c;
  EXPECT_TRUE(validate(c));
  c.tau = -1;
  EXPECT_FALSE(validate(c));
  c = {};
  c.max_iterations = 0;
  EXPECT_FALSE(validate(c));
  c = {};
  c.tau_scale = std::nan("");
  EXPECT_FALSE(validate(c));
  c = {};
  c.max_weight_ratio = -2;
  EXPECT_FALSE(validate(c));
  c = {};
  c.cut = 2;  // could drop members within the median distance
  EXPECT_FALSE(validate(c));
  c.tau_scale = 1.5;
  EXPECT_TRUE(validate(c));
  c = {};
  c.cut = 0;
  EXPECT_TRUE(validate(c));
  c.cut = -1;
  EXPECT_FALSE(validate(c));
}

TEST(CenteredClip, ClipCoefTapersToZeroAtTheCut) {
  const double tau = 2.0, cut = 6.0;
  EXPECT_EQ(clip_coef(1.0, tau, cut), 1.0);
  EXPECT_DOUBLE_EQ(clip_coef(4.0, tau, cut), 0.5);  // clipped, before the taper
  EXPECT_DOUBLE_EQ(clip_coef(6.0, tau, cut), 1.0 / 3);
  EXPECT_DOUBLE_EQ(clip_coef(9.0, tau, cut), (2.0 / 9) * 0.5);  // half way down the taper
  EXPECT_EQ(clip_coef(12.0, tau, cut), 0.0);
  EXPECT_EQ(clip_coef(1e9, tau, cut), 0.0);
  EXPECT_DOUBLE_EQ(clip_coef(1e9, tau, 0.0), tau / 1e9);  // no cut: the plain clip
  // Continuous: a rounding difference in d is a rounding difference in the factor, at the
  // radius, where the taper starts and at the cut.
  for (double d : {tau, 0.5 * cut * tau, cut * tau})
    EXPECT_NEAR(clip_coef(d * (1 + 1e-12), tau, cut), clip_coef(d * (1 - 1e-12), tau, cut), 1e-11)
        << d;
  EXPECT_EQ(clip_coef(0.0, 0.0, cut), 1.0);  // radius 0: only identical values count
  EXPECT_EQ(clip_coef(1.0, 0.0, cut), 0.0);
  AggregationConfig c;
  EXPECT_EQ(effective_cut(c), c.cut);
  c.tau = 1;  // a fixed radius has no cut
  EXPECT_EQ(effective_cut(c), 0.0);
}

// Two members sending -10x an honest vector: with the cut they count 0 and the result is the
// CenteredClip of the honest members alone (here: their mean, every one within tau); without
// it each still pulls by tau / 7.
TEST(CenteredClip, FarMembersCountZeroBeyondTheCut) {
  auto v = honest(5, 400, 0.05f, 21);
  const auto honest_mean = weighted_mean(v, std::vector<double>(5, 1.0), 5);
  for (int a = 0; a < 2; ++a) {
    v.push_back(v[a]);
    for (auto& x : v.back()) x *= -10.0f;
  }
  std::vector<double> w(7, 1.0);
  w[5] = w[6] = 10;  // claimed 10x the samples: capped at the median
  AggregationConfig cfg;
  cfg.kind = Aggregation::centered_clip;
  cfg.tolerance = 1e-9;
  cfg.max_iterations = 500;
  std::vector<float> out(400);
  auto st = centered_clip(out, spans(v), w, cfg);
  EXPECT_EQ(st.dropped, 2u);
  EXPECT_LT(dist(out, honest_mean), 1e-4 * st.tau);
  cfg.cut = 0;
  std::vector<float> pulled(400);
  st = centered_clip(pulled, spans(v), w, cfg);
  EXPECT_EQ(st.dropped, 0u);
  EXPECT_GT(dist(pulled, honest_mean), 0.1 * st.tau);
}

// A member whose distance at the result falls inside the taper (between cut/2 and cut x tau)
// counts with a factor between 0 and tau/d; the iteration still converges (it descends a
// bounded objective), where a rule that drops it and re-clips could flip it in and out.
TEST(CenteredClip, AMemberInsideTheTaperConverges) {
  auto v = honest(6, 300, 0.05f, 22);
  std::vector<float> a = v[0];
  std::mt19937_64 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : a) x += 0.2f * nd(rng);  // about 4 x the honest distances away
  v.push_back(a);
  std::vector<double> w(7, 1.0);
  AggregationConfig cfg;
  cfg.kind = Aggregation::centered_clip;
  cfg.tolerance = 1e-10;
  cfg.max_iterations = 1000;
  std::vector<float> out(300);
  const auto st = centered_clip(out, spans(v), w, cfg);
  EXPECT_LT(st.iterations, cfg.max_iterations);
  const std::vector<double> r(out.begin(), out.end());
  const double d = dist(a, r);
  EXPECT_GT(d, 0.5 * cfg.cut * st.tau);
  EXPECT_LT(d, cfg.cut * st.tau);
  const double c = clip_coef(d, st.tau, cfg.cut);
  EXPECT_GT(c, 0.0);
  EXPECT_LT(c, 0.99 * st.tau / d);
  // The fixed point: sum_i c_i (g_i - r) = 0 (to the iteration's tolerance).
  std::vector<double> acc(300, 0.0);
  double cs = 0;
  for (const auto& g : v) {
    const double ci = clip_coef(dist(g, r), st.tau, cfg.cut);
    cs += ci;
    for (std::size_t j = 0; j < 300; ++j) acc[j] += ci * (g[j] - r[j]);
  }
  double n2 = 0;
  for (double x : acc) n2 += x * x;
  EXPECT_LT(std::sqrt(n2) / cs, 1e-6 * st.tau);
}

// ButterflyClip: every owner clips its parts; the members still finish with bit-identical
// results, close to the honest mean, where the mean aggregation lets one member move the
// result by its whole (scaled) vector / n.
TEST(ButterflyClip, AttackersInTheGroupAreBoundedAndMembersAgree) {
  for (std::size_t attackers : {1, 2}) {
    const std::size_t n = 7, m = 2000;
    auto v = honest(n, m, 0.05f, 10 + attackers);
    for (std::size_t a = 0; a < attackers; ++a)
      for (auto& x : v[a]) x *= -50.0f;  // reversed and huge
    std::vector<double> w(n, 1.0);
    std::vector<double> honest_mean(m, 0.0);
    for (std::size_t i = attackers; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j) honest_mean[j] += v[i][j] / double(n - attackers);
    double err[2];
    for (int k = 0; k < 2; ++k) {
      SimOptions o;
      o.n = n;
      o.elems = m;
      o.weights = w;
      o.locals = v;
      o.seed = 5;
      o.aggregation.kind = k == 0 ? Aggregation::mean : Aggregation::centered_clip;
      RoundSim sim(o);
      sim.run();
      auto done = check_round(sim, true, k == 0);
      ASSERT_EQ(done.size(), n);
      for (std::uint32_t i = 1; i < n; ++i) ASSERT_EQ(sim.output(i), sim.output(0));
      err[k] = dist(sim.output(0), honest_mean);
    }
    // Per part (97 values) the attackers' pull is clipped; over the vector the error stays
    // a small fraction of what the mean suffers.
    std::printf(
        "%zu attacker(s) of 7: distance to the honest mean: mean %.3f, centered-clip %.4f\n",
        attackers, err[0], err[1]);
    EXPECT_LT(err[1], 0.05 * err[0])
        << attackers << " attackers: clip " << err[1] << " mean " << err[0];
  }
}
