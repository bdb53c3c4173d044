// Compression of all-reduce parts, per tensor. A part is a range of the flattened vector and
// may span several tensors; each tensor's piece is encoded with that tensor's codec (chosen by
// the schema: one codec for every tensor, or "auto" = CompressionPolicy by size). The payload
// of a compressed part is a sequence of segments [u32 little-endian length][codec buffer], in
// vector order; each codec buffer is self-describing (compression.hpp), so a receiver decodes
// without knowing the sender's plan and checks the total count against the part.
//
// Threading rule: pure functions of their arguments; the round runner calls them on its
// ThreadPool, never on the I/O thread.
#pragma once

#include <span>
#include <vector>

#include "starling/averaging/compression.hpp"
#include "starling/averaging/float_buffer.hpp"
#include "starling/averaging/schema.hpp"

namespace starling::averaging::detail {

class TensorCodecs {
 public:
  // From the schema's codec field: a codec name for every tensor, or "auto".
  static result<TensorCodecs> from_schema(const Schema& s);
  // True when some tensor is sent with a lossy codec (otherwise parts go as raw float32).
  bool compressed() const noexcept { return compressed_; }
  // Largest payload a compressed part of `elems` values may take (any codec, any split).
  std::size_t max_payload(std::size_t elems) const;

  // Encodes values [begin, begin + in.size()) of the vector. With `decoded` (same size, may
  // alias `in`), also writes what receivers will decode. With error feedback (`residual` and
  // `residual_out` of the same size), encodes in + residual and writes what the encoding lost
  // to residual_out.
  result<Bytes> encode(std::uint64_t begin, std::span<const float> in,
                       std::span<float> decoded = {}, std::span<const float> residual = {},
                       std::span<float> residual_out = {}) const;
  // Decodes a payload into `out` (resized to its values; at most max_count of them).
  static result<void> decode(BytesView payload, std::size_t max_count, FloatBuffer& out);

  std::size_t tensors() const noexcept { return ends_.size(); }
  const CodecSpec& spec(std::size_t tensor) const { return specs_[tensor]; }

 private:
  std::vector<std::uint64_t> ends_;  // flattened end offset of each tensor
  std::vector<CodecSpec> specs_;
  bool compressed_ = false;
};

}  // namespace starling::averaging::detail
