// Shared helpers of the codec tests: input generators, the documented error bounds computed
// independently of the codec, and a guard that quiets the rejection warnings.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "starling/averaging/compression.hpp"
#include "starling/core/log.hpp"

namespace starling::averaging::test_support {

using starling::Bytes;

inline const CodecId kAll[] = {CodecId::none,      CodecId::float16,   CodecId::bfloat16,
                               CodecId::uniform8,  CodecId::quantile8, CodecId::blockwise8,
                               CodecId::blockwise4};
inline const CodecId kQuantized[] = {CodecId::uniform8, CodecId::quantile8, CodecId::blockwise8,
                                     CodecId::blockwise4};
inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

inline std::vector<float> normal(std::size_t n, std::uint32_t seed, float sigma = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
inline std::vector<float> uniform(std::size_t n, std::uint32_t seed, float lo, float hi) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
// Student t with 2 degrees of freedom: infinite variance, a few values far out.
inline std::vector<float> heavy(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::student_t_distribution<float> d(2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

struct Case {
  const char* name;
  std::vector<float> data;
};
inline std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"normal", normal(20000, 1)});
  c.push_back({"normal_small_scale", normal(5000, 2, 1e-4f)});
  c.push_back({"uniform", uniform(20000, 3, -2.0f, 5.0f)});
  c.push_back({"positive_offset", uniform(9000, 4, 1000.0f, 1001.0f)});
  c.push_back({"heavy_tailed", heavy(20000, 5)});
  c.push_back({"constant", std::vector<float>(5000, 3.25f)});
  c.push_back({"negative_constant", std::vector<float>(777, -0.5f)});
  c.push_back({"all_zero", std::vector<float>(4096, 0.0f)});
  c.push_back({"tiny", std::vector<float>{1.5f}});
  c.push_back({"tiny_negative", std::vector<float>{-7.0f}});
  c.push_back({"odd_sized", normal(3 * 4096 + 37, 6)});
  c.push_back({"odd_sized_small", normal(131, 7)});
  c.push_back({"empty", {}});
  auto mixed = normal(4096 * 2 + 3, 8);
  for (std::size_t i = 0; i < 700; ++i) mixed[i] = 0.0f;              // a zero block
  for (std::size_t i = 4096; i < 4096 + 64; ++i) mixed[i] *= 1e-38f;  // subnormal-ish
  c.push_back({"mixed_blocks", mixed});
  {
    // Two scales interleaved: the inner quantile edges crowd into a tiny interval, which
    // exercises quantile8's fallback bin search.
    auto a = normal(20000, 9), b = normal(20000, 10, 1e-6f);
    for (std::size_t i = 0; i < a.size(); i += 2) a[i] = b[i];
    c.push_back({"two_scales", a});
  }
  c.push_back({"subnormal", std::vector<float>{1e-40f, -3e-41f, 0.0f, 1.4e-45f, 5e-39f}});
  c.push_back({"huge_range", std::vector<float>{-3e38f, 3e38f, 1.0f, -1.0f, 1e38f, 0.0f}});
  return c;
}

inline std::vector<CodecSpec> specs() {
  std::vector<CodecSpec> s;
  for (CodecId c : kAll) s.push_back({c, 0});
  // Non-default chunk sizes, including the smallest.
  s.push_back({CodecId::uniform8, 6});
  s.push_back({CodecId::quantile8, 10});
  s.push_back({CodecId::blockwise8, 6});
  s.push_back({CodecId::blockwise4, 6});
  s.push_back({CodecId::blockwise4, 13});
  return s;
}

inline float payload_f32(const Bytes& b, std::size_t off) {
  float f;
  std::memcpy(&f, b.data() + off, 4);
  return f;
}

// Per-chunk statistics of the input, computed here independently of the codec.
struct ChunkStats {
  std::vector<double> lo, hi, absmax;
};
inline ChunkStats chunk_stats(const std::vector<float>& x, std::size_t bs) {
  ChunkStats s;
  for (std::size_t b0 = 0; b0 < x.size(); b0 += bs) {
    double lo = x[b0], hi = x[b0], a = 0;
    for (std::size_t j = b0; j < std::min(x.size(), b0 + bs); ++j) {
      lo = std::min<double>(lo, x[j]);
      hi = std::max<double>(hi, x[j]);
      a = std::max(a, std::fabs(static_cast<double>(x[j])));
    }
    s.lo.push_back(lo);
    s.hi.push_back(hi);
    s.absmax.push_back(a);
  }
  return s;
}

// The documented bound for element i (quantile8 is checked per bin in check_bound).
inline double bound(const CodecSpec& spec, const std::vector<float>& x, std::size_t i,
                    const ChunkStats& cs) {
  double v = std::fabs(static_cast<double>(x[i]));
  switch (spec.codec) {
    case CodecId::none:
      return 0.0;
    case CodecId::float16:
      return v >= 0x1p-14 ? 0x1p-11 * v : 0x1p-25;
    case CodecId::bfloat16:
      return v >= 0x1p-126 ? 0x1p-8 * v : 0x1p-134;
    default:
      break;
  }
  std::size_t c = i / spec.block_size();
  double lo = cs.lo[c], hi = cs.hi[c], a = cs.absmax[c];
  constexpr double kFloor = 0x1p-140;
  if (spec.codec == CodecId::uniform8)
    return (hi - lo) / 255 / 2 + 0x1p-20 * std::max(std::fabs(lo), std::fabs(hi)) + kFloor;
  if (spec.codec == CodecId::blockwise8) return a / 254 + 0x1p-20 * a + kFloor;
  return a / 14 + 0x1p-20 * a + kFloor;  // blockwise4
}
inline double bound(const CodecSpec& spec, const std::vector<float>& x, std::size_t i) {
  return bound(spec, x, i, chunk_stats(x, spec.block_size() ? spec.block_size() : x.size()));
}

// The documented bound of every element of x encoded as `enc` (any codec; quantile8 from
// the codebook actually sent).
inline std::vector<double> element_bounds(const CodecSpec& spec, const std::vector<float>& x,
                                          const Bytes& enc) {
  std::vector<double> out(x.size());
  std::size_t bs = spec.block_size() ? spec.block_size() : std::max<std::size_t>(x.size(), 1);
  ChunkStats cs = chunk_stats(x, bs);
  if (spec.codec != CodecId::quantile8) {
    for (std::size_t i = 0; i < x.size(); ++i) out[i] = bound(spec, x, i, cs);
    return out;
  }
  auto info = inspect(enc).value();
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::size_t chunk = i / bs;
    std::size_t cb = info.params_offset + chunk * 256 * 4;
    int b = enc[info.payload_offset + i];
    double c = payload_f32(enc, cb + 4 * b);
    double below = b > 0 ? payload_f32(enc, cb + 4 * (b - 1)) : cs.lo[chunk];
    double above = b < 255 ? payload_f32(enc, cb + 4 * (b + 1)) : cs.hi[chunk];
    out[i] = std::max(c - below, above - c);
  }
  return out;
}

// Checks y against x for spec; returns the number of violations (and reports the first).
inline int check_bound(const CodecSpec& spec, const std::vector<float>& x,
                       const std::vector<float>& y, const Bytes& enc, const char* name) {
  int bad = 0;
  auto report = [&](std::size_t i, double err, double lim) {
    if (bad++ == 0)
      ADD_FAILURE() << name << " " << to_string(spec.codec) << "/" << spec.block_size()
                    << " element " << i << " x=" << x[i] << " y=" << y[i] << " err=" << err
                    << " bound=" << lim;
  };
  std::size_t bs = spec.block_size() ? spec.block_size() : std::max<std::size_t>(x.size(), 1);
  ChunkStats cs = chunk_stats(x, bs);
  if (spec.codec == CodecId::quantile8) {
    auto info = inspect(enc).value();
    auto lims = element_bounds(spec, x, enc);
    for (std::size_t i = 0; i < x.size(); ++i) {
      // Decoded to its bin's code, within the neighbouring gaps.
      double c = payload_f32(
          enc, info.params_offset + (i / bs) * 256 * 4 + 4 * enc[info.payload_offset + i]);
      double err = std::fabs(static_cast<double>(y[i]) - x[i]);
      if (static_cast<double>(y[i]) != c || err > lims[i]) report(i, err, lims[i]);
    }
    return bad;
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    double err = std::fabs(static_cast<double>(y[i]) - static_cast<double>(x[i]));
    double lim = bound(spec, x, i, cs);
    bool ok = spec.codec == CodecId::none
                  ? std::bit_cast<std::uint32_t>(x[i]) == std::bit_cast<std::uint32_t>(y[i])
                  : err <= lim;
    if (!ok) report(i, err, lim);
  }
  return bad;
}

// Rejections are logged as warnings; the tests that provoke thousands keep the log quiet.
struct QuietLog {
  QuietLog() { set_log_level("error"); }
  ~QuietLog() { set_log_level("warn"); }
};

inline double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, std::fabs(static_cast<double>(v)));
  return m;
}

}  // namespace starling::averaging::test_support
