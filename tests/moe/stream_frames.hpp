// Test support for streamed calls: frames of a stream made by the slicer, and ramp tensors.
#pragma once

#include <gtest/gtest.h>

#include "starling/moe/stream.hpp"
#include "starling/pb/moe.pb.h"

namespace starling::moe::test {

using Frame = pb::MoeStreamFrame;

// The frames of a stream for uid "ffn.0" carrying `ts` in chunks of `chunk` values.
inline std::vector<Frame> slice(const std::vector<TensorData>& ts, std::uint64_t chunk,
                                averaging::CodecSpec codec = {}) {
  pb::MoeStreamHeader h;
  h.set_uid("ffn.0");
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<std::span<const float>> spans;
  for (const auto& t : ts) {
    shapes.push_back(t.shape);
    spans.emplace_back(t.values);
  }
  StreamSlicer s(h, shapes, spans, codec, chunk);
  std::vector<Frame> out;
  for (;;) {
    auto f = s.next();
    EXPECT_TRUE(f) << f.error().message();
    if (!f || !f.value()) break;
    out.push_back(*f.value());
  }
  return out;
}

// A tensor of `shape` with values 0, 0.001, ... 0.999, 0, ...
inline TensorData ramp(std::vector<std::int64_t> shape) {
  TensorData t{std::move(shape), {}};
  t.values.resize(t.numel());
  for (std::size_t i = 0; i < t.values.size(); ++i) t.values[i] = 0.001f * float(i % 1000);
  return t;
}

}  // namespace starling::moe::test
