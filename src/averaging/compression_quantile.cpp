// Quantile 8-bit codec, one chunk at a time. See compression_kernels.hpp and the bound in
// compression.hpp.
//
// Encoding: the 255 inner bin edges are quantiles of a strided sample of the chunk (the
// whole chunk when it has at most kQuantileSample values); each value is sent as the number
// of edges <= it (0..255); each bin decodes to the mean of the values it received, clamped
// to the bin's range.
//
// Finding the bin without branches: a uniform grid over [edge[1], edge[255]] whose cell
// index cell(x) is a monotone function of x. An edge e with cell(e) < cell(x) is <= x and one
// with cell(e) > cell(x) is > x, so the bin of x is base[cell] (edges in earlier cells) plus
// the edges of its own cell that are <= x. When every cell holds at most kSlots distinct
// edge values (the usual case) that is a fixed, branch-free computation; otherwise the chunk
// falls back to a branchless binary search over all edges.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "averaging/compression_kernels.hpp"

namespace starling::averaging::detail {
namespace {

constexpr std::size_t kBins = kQuantileBins;
constexpr std::size_t kSlots = 3;
constexpr std::size_t kMaxCells = 1024;
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Cell {
  float edge[kSlots];           // distinct edge values in this cell, +inf when unused
  std::uint8_t weight[kSlots];  // how many edges have that value
  std::uint8_t base;            // edges in earlier cells
};

struct Grid {
  float origin = 0, inv = 0, last = 0;  // last = cells - 1
  // Monotone non-decreasing in x (every step is); NaN-free input gives a cell in range.
  std::uint32_t cell(float x) const {
    float t = (x - origin) * inv;
    t = t > 0.0f ? t : 0.0f;
    t = t < last ? t : last;
    return static_cast<std::uint32_t>(t);
  }
};

// Builds the grid; returns false if some cell would need more than kSlots slots.
bool build_grid(const std::array<float, kBins>& edge, std::size_t cells, Grid& g,
                std::vector<Cell>& table) {
  g.origin = edge[1];
  float span = edge[kBins - 1] - edge[1];
  float inv = static_cast<float>(cells) / span;
  g.inv = span > 0 && std::isfinite(inv) ? inv : 0.0f;
  g.last = static_cast<float>(cells - 1);
  Cell empty{};
  std::fill(std::begin(empty.edge), std::end(empty.edge), kInf);
  table.assign(cells, empty);
  std::vector<std::uint8_t> used(cells, 0);
  std::vector<std::uint16_t> in_cell(cells + 1, 0);
  for (std::size_t k = 1; k < kBins; ++k) {
    std::uint32_t c = g.cell(edge[k]);
    Cell& cell = table[c];
    std::uint8_t& u = used[c];
    if (u > 0 && cell.edge[u - 1] == edge[k]) {
      ++cell.weight[u - 1];
    } else {
      if (u == kSlots) return false;
      cell.edge[u] = edge[k];
      cell.weight[u] = 1;
      ++u;
    }
    ++in_cell[c + 1];
  }
  std::uint32_t base = 0;
  for (std::size_t c = 0; c < cells; ++c) {
    base += in_cell[c];
    table[c].base = static_cast<std::uint8_t>(base);
  }
  return true;
}

}  // namespace

void encode_quantile_chunk(const float* in, std::size_t n, std::uint8_t* params,
                           std::uint8_t* out) {
  std::array<float, kBins> codebook{};
  if (n == 0) return;

  // Sample and edges. edge[k] (k = 1..255) is the lower edge of bin k; edge[0] = -inf.
  std::size_t m = std::min(n, kQuantileSample);
  std::vector<float> sample(m);
  for (std::size_t j = 0; j < m; ++j) sample[j] = in[(j * n) / m];
  std::sort(sample.begin(), sample.end());
  std::array<float, kBins> edge{};
  edge[0] = -kInf;
  for (std::size_t k = 1; k < kBins; ++k) edge[k] = sample[(k * m) / kBins];
  Stats st = chunk_stats(in, n);
  float lo = from_order_key(st.min_key), hi = from_order_key(st.max_key);

  Grid grid;
  std::vector<Cell> table;
  std::size_t cells = std::clamp<std::size_t>(n / 4, 64, kMaxCells);
  bool use_grid = build_grid(edge, cells, grid, table);

  std::array<double, kBins> sum{};
  std::array<std::uint32_t, kBins> cnt{};
  for (std::size_t i0 = 0; i0 < n; i0 += kTile) {
    std::size_t len = std::min(kTile, n - i0);
    float x[kTile];
    std::uint32_t k[kTile] = {};
    for (std::size_t i = 0; i < kTile; ++i) x[i] = in[i0 + (i < len ? i : 0)];
    if (use_grid) {
      for (std::size_t i = 0; i < kTile; ++i) {
        const Cell& c = table[grid.cell(x[i])];
        std::uint32_t v = c.base;
        for (std::size_t s = 0; s < kSlots; ++s)
          v += static_cast<std::uint32_t>(x[i] >= c.edge[s]) * c.weight[s];
        k[i] = v;
      }
    } else {
      // Branchless binary search: k = number of edge[1..255] <= x.
      for (std::uint32_t step = kBins / 2; step >= 1; step /= 2) {
        for (std::size_t i = 0; i < kTile; ++i)
          k[i] += static_cast<std::uint32_t>(x[i] >= edge[k[i] + step]) * step;
      }
    }
    for (std::size_t i = 0; i < len; ++i) {
      out[i0 + i] = static_cast<std::uint8_t>(k[i]);
      sum[k[i]] += x[i];
      ++cnt[k[i]];
    }
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
