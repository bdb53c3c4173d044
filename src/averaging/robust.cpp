// CenteredClip and weight caps (robust.hpp).
#include "starling/averaging/robust.hpp"

#include <algorithm>
#include <cmath>

namespace starling::averaging {

result<Aggregation> parse_aggregation(const std::string& s) {
  if (s == "mean") return Aggregation::mean;
  if (s == "centered-clip") return Aggregation::centered_clip;
  return make_error(errc::invalid_argument, "unknown aggregation '" + s + "' (mean|centered-clip)");
}

const char* to_string(Aggregation a) {
  return a == Aggregation::centered_clip ? "centered-clip" : "mean";
}

result<void> validate(const AggregationConfig& c) {
  auto bad = [](const char* why) {
    return make_error(errc::invalid_argument, std::string("aggregation: ") + why);
  };
  if (!std::isfinite(c.tau) || c.tau < 0) return bad("tau must be finite and >= 0");
  if (!std::isfinite(c.tau_scale) || c.tau_scale <= 0) return bad("tau_scale must be > 0");
  if (c.max_iterations == 0) return bad("max_iterations must be at least 1");
  if (!std::isfinite(c.tolerance) || c.tolerance < 0) return bad("tolerance must be >= 0");
  if (!std::isfinite(c.max_weight_ratio) || c.max_weight_ratio < 0)
    return bad("max_weight_ratio must be finite and >= 0");
  if (!std::isfinite(c.cut) || c.cut < 0) return bad("cut must be finite and >= 0");
  if (c.cut > 0 && !(c.cut * c.tau_scale > 2))
    return bad("cut x tau_scale must exceed 2 (or cut 0: no cut)");
  return success();
}

namespace {
double median_of(std::vector<double>& v) {
  const std::size_t n = v.size();
  const std::size_t mid = n / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (n % 2 == 1) return hi;
  const double lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return 0.5 * (lo + hi);
}
}  // namespace

std::vector<double> cap_weights(std::span<const double> w, double max_ratio) {
  std::vector<double> out(w.begin(), w.end());
  if (max_ratio <= 0) return out;
  std::vector<double> pos;
  for (double x : w)
    if (x > 0) pos.push_back(x);
  if (pos.empty()) return out;
  const double cap = max_ratio * median_of(pos);
  for (auto& x : out) x = std::min(x, cap);
  return out;
}

double effective_cut(const AggregationConfig& cfg) {
  return cfg.tau > 0 ? 0.0 : cfg.cut;
}

double clip_coef(double d, double tau, double cut) {
  if (!(d > tau)) return 1.0;
  if (!(tau > 0)) return 0.0;
  double c = tau / d;
  if (cut > 0) c *= std::clamp((cut * tau - d) / (0.5 * cut * tau), 0.0, 1.0);
  return c;
}

void coordinate_median(std::span<double> out, const std::vector<std::span<const float>>& inputs) {
  std::vector<double> col(inputs.size());
  for (std::size_t j = 0; j < out.size(); ++j) {
    for (std::size_t i = 0; i < inputs.size(); ++i) col[i] = inputs[i][j];
    out[j] = median_of(col);
  }
}

ClipStats centered_clip_with(std::span<float> out,
                             const std::vector<std::span<const float>>& inputs,
                             std::span<const double> weights, const AggregationConfig& cfg,
                             double tau, double cut) {
  ClipStats st;
  const std::size_t n = inputs.size(), m = out.size();
  if (n == 0) {
    std::fill(out.begin(), out.end(), 0.0f);
    return st;
  }
  std::vector<double> w = cap_weights(weights, cfg.max_weight_ratio);
  double total = 0;
  for (double x : w) total += x;
  if (!(total > 0)) {
    w.assign(n, 1.0);
    total = static_cast<double>(n);
  }
  std::vector<double> v(m);
  coordinate_median(v, inputs);
  std::vector<double> dist(n);
  auto distances = [&] {
    for (std::size_t i = 0; i < n; ++i) {
      double s = 0;
      const float* g = inputs[i].data();
      for (std::size_t j = 0; j < m; ++j) {
        const double d = static_cast<double>(g[j]) - v[j];
        s += d * d;
      }
      dist[i] = std::sqrt(s);
    }
  };
  distances();
  if (!(tau > 0)) {
    std::vector<double> d = dist;
    tau = cfg.tau_scale * median_of(d);
  }
  st.tau = tau;
  std::vector<double> step(m);
  std::vector<double> coef(n);
  for (std::uint32_t it = 0; it < cfg.max_iterations; ++it) {
    if (it > 0) distances();
    st.clipped = st.dropped = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double c = clip_coef(dist[i], tau, cut);
      st.clipped += c < 1.0;
      st.dropped += c == 0.0;
      coef[i] = w[i] * c / total;
    }
    std::fill(step.begin(), step.end(), 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      if (coef[i] == 0) continue;
      const float* g = inputs[i].data();
      const double c = coef[i];
      for (std::size_t j = 0; j < m; ++j) step[j] += c * (static_cast<double>(g[j]) - v[j]);
    }
    double step_sq = 0, v_sq = 0;
    for (std::size_t j = 0; j < m; ++j) {
      v[j] += step[j];
      step_sq += step[j] * step[j];
      v_sq += v[j] * v[j];
    }
    st.iterations = it + 1;
    if (std::sqrt(step_sq) <= cfg.tolerance * std::max(std::sqrt(v_sq), 1e-30)) break;
  }
  for (std::size_t j = 0; j < m; ++j) out[j] = static_cast<float>(v[j]);
  return st;
}

ClipStats centered_clip(std::span<float> out, const std::vector<std::span<const float>>& inputs,
                        std::span<const double> weights, const AggregationConfig& cfg) {
  return centered_clip_with(out, inputs, weights, cfg, cfg.tau, effective_cut(cfg));
}

}  // namespace starling::averaging
