// Robust aggregation for all-reduce part owners (BTARD's ButterflyClip): instead of the
// weighted mean of the members' values for a part, the owner computes CenteredClip, a
// weighted mean in which every member's pull on the result is clipped to a radius tau:
//   v0 = the coordinate-wise median;
//   v <- v + sum_i w_i (g_i - v) min(1, tau / |g_i - v|) / sum_i w_i, until the step is below
//   tolerance x |v| or after max_iterations.
// A member within tau of the result counts exactly as in the mean; one far away (a huge or
// reversed gradient) moves the result by at most w_i tau / sum w. With an adaptive radius and
// a cut (AggregationConfig::cut), a member far beyond tau stops counting: its factor
// min(1, tau/d) falls linearly to 0 between cut/2 x tau and cut x tau (clip_coef), so a far
// outlier no longer pulls the result at all. Weights come from the
// members' claimed sample counts and are capped (cap_weights) so that a peer cannot buy
// influence by claiming samples. No I/O; pure functions.
//
// Threading rule: plain functions, callable from any thread on disjoint data.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "starling/core/result.hpp"

namespace starling::averaging {

enum class Aggregation : std::uint8_t { mean, centered_clip };
result<Aggregation> parse_aggregation(const std::string& s);  // "mean" | "centered-clip"
const char* to_string(Aggregation a);

struct AggregationConfig {
  Aggregation kind = Aggregation::mean;
  // CenteredClip's radius. > 0: absolute (in the units of the values, per part); 0: adaptive,
  // tau_scale x the median over members of |g_i - coordinate-wise median| (per part).
  double tau = 0;
  double tau_scale = 1.0;
  std::uint32_t max_iterations = 20;
  double tolerance = 1e-5;  // relative step size at which the iteration stops
  // Each weight is capped at max_weight_ratio x the median weight (0: no cap; the mean
  // aggregation uses the weights as given).
  double max_weight_ratio = 1.0;
  // With an adaptive radius: members farther than cut x tau from the result count 0, and the
  // factor falls linearly to that from cut/2 x tau (clip_coef). 0: no cut. Must exceed
  // 2 / tau_scale, so that the members within the median distance always count (the check
  // accepts an adaptive tau of 0.5 x tau_scale x that median). A fixed radius has no cut
  // (effective_cut): nothing would bound how many members it drops.
  double cut = 6.0;
};
// Errors: non-finite or negative parameters, max_iterations 0, a cut in (0, 2 / tau_scale].
result<void> validate(const AggregationConfig& c);

// Weights capped at max_ratio x the median of the positive weights (unchanged if max_ratio <= 0
// or no weight is positive).
std::vector<double> cap_weights(std::span<const double> w, double max_ratio);

// The cut in force: cfg.cut with an adaptive radius (tau 0), 0 with a fixed one.
double effective_cut(const AggregationConfig& cfg);

// A member's factor at distance d from the result: 1 within tau, else tau / d, and with
// cut > 0 that times clamp((cut x tau - d) / (cut/2 x tau), 0, 1): continuous in d (a
// rounding difference in d moves it by a rounding difference), 0 from cut x tau on. tau 0:
// 1 at d 0, else 0. The owner (centered_clip), the members' check (check_fixed_point) and
// the evidence check (fixed_point_residual) all use this one function.
double clip_coef(double d, double tau, double cut);

struct ClipStats {
  double tau = 0;                // the radius used
  std::uint32_t iterations = 0;  // update steps taken
  std::uint32_t clipped = 0;     // members clipped in the last step
  std::uint32_t dropped = 0;     // of those, members counting 0 (beyond the cut)
};

// out = CenteredClip of inputs (equal sizes, == out.size()) with weights (capped here by
// cfg.max_weight_ratio; all zero: equal weights), cut effective_cut(cfg). Inputs must be
// finite. Empty inputs: out is zeroed. The iteration is a gradient step of size 1 / sum w on
// sum_i w_i rho(|g_i - v|) with rho' = d x clip_coef(d), whose curvature lies in
// [-2 / cut, 1]: every step lowers it, so it converges (no dropped set flips back and forth).
ClipStats centered_clip(std::span<float> out, const std::vector<std::span<const float>>& inputs,
                        std::span<const double> weights, const AggregationConfig& cfg);
// The same with the given radius (> 0; else the adaptive one) and cut, whatever cfg says of
// them.
ClipStats centered_clip_with(std::span<float> out,
                             const std::vector<std::span<const float>>& inputs,
                             std::span<const double> weights, const AggregationConfig& cfg,
                             double tau, double cut);

// The coordinate-wise median of the inputs into out (the mean of the two middle values for an
// even count).
void coordinate_median(std::span<double> out, const std::vector<std::span<const float>>& inputs);

}  // namespace starling::averaging
