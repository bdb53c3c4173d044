// Round data for tests of training::Collaboration: named vectors flattened into one input
// buffer, an output buffer filled with NaN (so a test can tell it was never written), and
// split() to copy a round's output back into the named vectors.
#pragma once

#include <algorithm>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "starling/training/collaboration.hpp"

namespace starling::test {

inline training::RoundData round_data(
    std::vector<std::pair<std::string, std::span<const float>>> named) {
  auto buf = std::make_shared<std::pair<std::vector<float>, std::vector<float>>>();
  training::RoundData d;
  for (const auto& [name, v] : named) {
    d.layout.emplace_back(name, v.size());
    buf->first.insert(buf->first.end(), v.begin(), v.end());
  }
  buf->second.assign(buf->first.size(), std::numeric_limits<float>::quiet_NaN());
  d.input = buf->first;
  d.output = buf->second;
  d.owner = buf;
  return d;
}

// Copies `d.output` into `outs` in layout order.
inline void split(const training::RoundData& d, std::vector<std::span<float>> outs) {
  std::size_t off = 0;
  for (std::size_t i = 0; i < outs.size() && i < d.layout.size(); ++i) {
    const std::size_t n = d.layout[i].second;
    std::copy_n(d.output.begin() + static_cast<std::ptrdiff_t>(off), n, outs[i].begin());
    off += n;
  }
}

// True if no element of the output was written (all still NaN).
inline bool untouched(const training::RoundData& d) {
  return std::all_of(d.output.begin(), d.output.end(), [](float x) { return x != x; });
}

}  // namespace starling::test
