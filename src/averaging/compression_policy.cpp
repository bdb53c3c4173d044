// CompressionPolicy (codec choice per tensor) and ErrorFeedback (residual carried between
// rounds).
#include <algorithm>
#include <cmath>

#include "averaging/compression_kernels.hpp"

namespace starling::averaging {

CodecSpec CompressionPolicy::choose(std::size_t tensor_index, std::size_t count) const {
  if (auto it = per_tensor.find(tensor_index); it != per_tensor.end()) return it->second;
  if (count <= small_max) return small;
  if (count <= medium_max) return medium;
  return large;
}

CodecSpec CompressionPolicy::choose(std::size_t tensor_index, std::span<const float> data) const {
  CodecSpec spec = choose(tensor_index, data.size());
  if (spec.codec != CodecId::float16) return spec;
  // Beyond float16 range: |x| >= 65520 (0x477ff000) rounds to inf. Non-finite input keeps
  // float16 (encode() reports it).
  std::uint32_t ab = detail::max_abs_bits(data.data(), data.size());
  if (ab >= 0x477ff000u && ab < 0x7f800000u) return float16_overflow;
  return spec;
}

result<Bytes> ErrorFeedback::encode(const CodecSpec& spec, std::span<const float> input,
                                    const EncodeOptions& options) {
  std::size_t n = input.size();
  if (residual_.size() != n) residual_.assign(n, 0.0f);
  corrected_.resize(n);
  decoded_.resize(n);
  const float* __restrict r = residual_.data();
  float* __restrict c = corrected_.data();
  for (std::size_t i = 0; i < n; ++i) c[i] = input[i] + r[i];
  ST_TRY(auto bytes, averaging::encode(spec, corrected_, options));
  DecodeOptions dopt;
  dopt.allow_non_finite = options.allow_non_finite;
  dopt.pool = options.pool;
  ST_TRY(averaging::decode(bytes, decoded_, dopt));
  float* __restrict rw = residual_.data();
  const float* __restrict d = decoded_.data();
  for (std::size_t i = 0; i < n; ++i) rw[i] = c[i] - d[i];
  if (options.allow_non_finite) {
    // inf/nan passed through: there is no meaningful error to carry for them.
    for (std::size_t i = 0; i < n; ++i)
      if (!std::isfinite(rw[i])) rw[i] = 0.0f;
  }
  return bytes;
}

}  // namespace starling::averaging
