// Tensor schema: the named tensors an averager works on (names, shapes, dtype) plus the codec
// id, and the schema hash that matchmaking compares so that only peers with identical schemas
// are grouped. Also the flattening view: the tensors laid end to end as one float vector.
//
// Threading rule: plain values; the flattening helpers read/write caller-owned spans.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "starling/core/bytes.hpp"
#include "starling/core/result.hpp"

namespace starling::averaging {

enum class DType : std::uint8_t { f32 = 1 };

struct TensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;  // empty = scalar
  DType dtype = DType::f32;
  // Number of elements (product of dims; 1 for a scalar).
  std::uint64_t numel() const;
  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

struct Schema {
  std::vector<TensorSpec> tensors;
  // Wire compression: a codec name (compression.hpp) for every tensor, or "auto" for a codec
  // per tensor by size (CompressionPolicy defaults: small float32, medium float16, large
  // blockwise8).
  std::string codec = "none";
  std::uint64_t numel() const;  // total flattened elements
  friend bool operator==(const Schema&, const Schema&) = default;
};

// Rejects empty names, duplicate names, negative dims, element counts above 2^40.
result<void> validate_schema(const Schema& s);

// 32-byte BLAKE2b of a canonical encoding (names, shapes, dtypes, codec, in order).
inline constexpr std::size_t kSchemaHashSize = 32;
Bytes schema_hash(const Schema& s);

// Generic 32-byte BLAKE2b of bytes (part hashes in state transfer, group ids).
Bytes blake2b_256(BytesView data);

// A named tensor view supplied by the caller: `data.size()` must equal the spec's numel.
struct TensorView {
  std::string name;
  std::span<float> data;
};

// Copies elements [begin, end) of the flattened vector (tensors in schema order) into `out`
// (out.size() == end - begin), or back from `in`. Views must match the schema (checked by
// the caller with check_views()).
void gather_flat(std::span<const TensorView> views, std::uint64_t begin, std::span<float> out);
void scatter_flat(std::span<const TensorView> views, std::uint64_t begin,
                  std::span<const float> in);
result<void> check_views(const Schema& s, std::span<const TensorView> views);

}  // namespace starling::averaging
