// Quantile 8-bit codec, one chunk at a time. See compression_kernels.hpp and the bound in
// compression.hpp.
//
// Encoding: the 255 inner bin edges are quantiles of a strided sample of the chunk (the
// whole chunk when it has at most kQuantileSample values); each value is sent as the number
// of edges <= it (0..255), found through a small lookup grid plus exact correction steps;
// each bin decodes to the mean of the values it received, clamped to the bin's range.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "averaging/compression_kernels.hpp"

namespace starling::averaging::detail {

void encode_quantile_chunk(const float* in, std::size_t n, std::uint8_t* params,
                           std::uint8_t* out) {
  constexpr std::size_t kBins = kQuantileBins;
  std::array<float, kBins> codebook{};
  if (n == 0) return;

  // Sample and edges. edge[k] (k = 1..255) is the lower edge of bin k.
  std::size_t m = std::min(n, kQuantileSample);
  std::vector<float> sample(m);
  for (std::size_t j = 0; j < m; ++j) sample[j] = in[(j * n) / m];
  std::sort(sample.begin(), sample.end());
  std::array<float, kBins + 1> edge{};
  for (std::size_t k = 1; k < kBins; ++k) edge[k] = sample[(k * m) / kBins];
  float lo_edge = edge[1], hi_edge = edge[kBins - 1];

  // Lookup grid over [edge[1], edge[255]]: start[c] = number of edges <= the cell's start.
  std::size_t cells = std::clamp<std::size_t>(n / 16, 16, 1024);
  double span = static_cast<double>(hi_edge) - static_cast<double>(lo_edge);
  double inv = span > 0 ? static_cast<double>(cells) / span : 0.0;
  std::vector<std::uint8_t> start(cells);
  for (std::size_t c = 0; c < cells; ++c) {
    double s = static_cast<double>(lo_edge) + (span > 0 ? static_cast<double>(c) / inv : 0.0);
    auto it = std::upper_bound(edge.begin() + 1, edge.begin() + kBins, s,
                               [](double v, float e) { return v < static_cast<double>(e); });
    start[c] = static_cast<std::uint8_t>(it - (edge.begin() + 1));
  }

  std::array<double, kBins> sum{};
  std::array<std::uint32_t, kBins> cnt{};
  float lo = in[0], hi = in[0];
  for (std::size_t i = 0; i < n; ++i) {
    float x = in[i];
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    double t = (static_cast<double>(x) - static_cast<double>(lo_edge)) * inv;
    t = std::clamp(t, 0.0, static_cast<double>(cells - 1));
    std::size_t k = start[static_cast<std::size_t>(t)];
    // Exact correction: afterwards edge[k] <= x < edge[k + 1] (with edge[0] = -inf and
    // edge[256] = +inf).
    while (k + 1 < kBins && x >= edge[k + 1]) ++k;
    while (k > 0 && x < edge[k]) --k;
    out[i] = static_cast<std::uint8_t>(k);
    sum[k] += x;
    ++cnt[k];
  }

  // Bin k holds values in [bin_lo(k), bin_hi(k)]; its code is the clamped mean, or the lower
  // bound when empty, so codes are sorted and each lies inside its bin.
  for (std::size_t k = 0; k < kBins; ++k) {
    float blo = k == 0 ? lo : edge[k];
    float bhi = k + 1 == kBins ? hi : edge[k + 1];
    blo = std::min(blo, bhi);  // edges are sample values, so this only guards rounding
    float c = cnt[k] ? static_cast<float>(sum[k] / cnt[k]) : blo;
    c = std::clamp(c, blo, bhi);
    if (k > 0) c = std::max(c, codebook[k - 1]);
    codebook[k] = c;
  }
  std::memcpy(params, codebook.data(), kBins * sizeof(float));
}

void decode_quantile_chunk(const std::uint8_t* params, const std::uint8_t* in, std::size_t n,
                           float* out, bool acc, float w) {
  std::array<float, kQuantileBins> codebook;
  std::memcpy(codebook.data(), params, sizeof(codebook));
  if (acc) {
    for (std::size_t i = 0; i < n; ++i) out[i] += w * codebook[in[i]];
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = codebook[in[i]];
  }
}

}  // namespace starling::averaging::detail
