// CenteredClip inside the networked all-reduce (RoundConfig::aggregation): 6-8 members on
// loopback, one or two of them attacking with huge, sign-flipped (x1000) or NaN values and an
// inflated weight. With the plain mean the honest result is destroyed; with centered-clip
// every honest member holds the same vector, within the bound of the honest mean.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "averaging/compression_test_support.hpp"
#include "net_harness.hpp"
#include "starling/averaging/robust.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace std::chrono_literals;

namespace {

enum class Attack { huge, sign_flip, nan };

// CenteredClip's fixed point with a weight share d < 1/2 of attackers stays within
// d tau / (1 - d) of the honest mean when every honest value lies within tau minus that of it.
double centered_clip_bound(double share, double tau) {
  return share * tau / (1.0 - share);
}

struct Outcome {
  double err = 0;    // |honest member's result - honest mean| (L2 over the whole vector)
  double bound = 0;  // sqrt(parts) * (per-part bound + codec slack)
  bool identical = true;
};

Outcome run(std::size_t n, std::size_t attackers, Attack attack, Aggregation agg,
            const std::string& codec, bool feedback) {
  auto schema = test::test_schema(6000);  // 18000 + 858 + 1 values, parts of 4096
  schema.codec = codec;
  auto cfg = test::base_config();
  cfg.round.stall_timeout = 15s;
  cfg.round.aggregation.kind = agg;
  cfg.round.aggregation.tau = 1.0;
  cfg.round.aggregation.max_iterations = 50;
  cfg.round.aggregation.tolerance = 1e-6;
  cfg.error_feedback = feedback;
  test::Cluster c(n, schema, cfg, {}, 5);
  const std::size_t N = schema.numel();
  // Honest members: a common centre plus noise of 0.001 per value (0.064 over a part).
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  std::normal_distribution<float> nd(0.0f, 0.001f);
  std::vector<float> centre(N);
  for (auto& x : centre) x = ud(rng);
  std::vector<double> honest_mean(N, 0.0);
  const std::size_t honest = n - attackers;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<float> v(N);
    for (std::size_t j = 0; j < N; ++j) v[j] = centre[j] + nd(rng);
    if (i >= honest) {  // the attackers are the last members
      for (auto& x : v) {
        if (attack == Attack::huge) x = 1e6f;
        if (attack == Attack::sign_flip) x = -1000.0f * x;
        if (attack == Attack::nan) x = std::nanf("");
      }
    } else {
      for (std::size_t j = 0; j < N; ++j) honest_mean[j] += v[j] / double(honest);
    }
    c.set_flat(i, v);
  }
  std::vector<double> w(n, 1.0);
  for (std::size_t i = honest; i < n; ++i) w[i] = 1000.0;  // claims 1000x the samples
  auto g = c.group(w);
  std::vector<StepOptions> so(n);
  for (std::size_t i = 0; i < n; ++i) {
    so[i].weight = w[i];
    so[i].group = g;
  }
  auto res = c.step_all(so);
  Outcome o;
  std::vector<float> first;
  for (std::size_t i = 0; i < honest; ++i) {
    EXPECT_TRUE(res[i]) << "node " << i << ": " << res[i].error().message();
    if (!res[i]) continue;
    auto f = c.flat(i);
    if (first.empty())
      first = f;
    else if (std::memcmp(f.data(), first.data(), f.size() * sizeof(float)) != 0)
      o.identical = false;
  }
  double s = 0;
  for (std::size_t j = 0; j < N && !first.empty(); ++j) {
    const double e = double(first[j]) - honest_mean[j];
    s += std::isfinite(e) ? e * e : INFINITY;
  }
  o.err = std::sqrt(s);
  // Capped weights: each attacker has the median weight 1, a share of attackers / n.
  const double share = double(attackers) / double(n);
  const double parts = std::ceil(double(N) / 4096) + double(n);  // share boundaries split parts
  const double slack = codec == "none" ? 1e-3 : 0.15;            // float16 error over a part, twice
  o.bound = std::sqrt(parts) * (centered_clip_bound(share, 1.0) + slack);
  return o;
}

struct Case {
  const char* name;
  std::size_t n, attackers;
  Attack attack;
  const char* codec;
  bool feedback;
};

class RobustRound : public ::testing::TestWithParam<Case> {};

TEST_P(RobustRound, CenteredClipHoldsWhereTheMeanIsDestroyed) {
  test_support::QuietLog quiet;
  const auto p = GetParam();
  auto clip = run(p.n, p.attackers, p.attack, Aggregation::centered_clip, p.codec, p.feedback);
  EXPECT_TRUE(clip.identical);
  EXPECT_LE(clip.err, clip.bound);
  auto mean = run(p.n, p.attackers, p.attack, Aggregation::mean, p.codec, p.feedback);
  if (p.attack == Attack::nan) {
    // NaN is malformed data: the owners drop the sender under either aggregation.
    EXPECT_LE(mean.err, 1e-2);
  } else {
    EXPECT_FALSE(mean.err <= 100 * clip.bound) << "the plain mean should be destroyed";
  }
  std::printf(
      "[ %s ] n=%zu attackers=%zu codec=%s: centered-clip error %.4f (bound %.3f), "
      "mean error %.3g\n",
      p.name, p.n, p.attackers, p.codec, clip.err, clip.bound, mean.err);
}

INSTANTIATE_TEST_SUITE_P(
    Attacks, RobustRound,
    ::testing::Values(Case{"huge", 6, 1, Attack::huge, "none", false},
                      Case{"signflip_two_of_8", 8, 2, Attack::sign_flip, "none", false},
                      Case{"signflip_float16_feedback", 6, 1, Attack::sign_flip, "float16", true},
                      Case{"nan", 6, 1, Attack::nan, "none", false}),
    [](const auto& i) { return std::string(i.param.name); });

}  // namespace
