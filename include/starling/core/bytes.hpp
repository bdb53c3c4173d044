// Byte buffers and small encoding helpers (hex, unsigned varint).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "starling/core/result.hpp"

namespace starling {

using Bytes = std::vector<std::uint8_t>;
using BytesView = std::span<const std::uint8_t>;
using MutableBytesView = std::span<std::uint8_t>;

inline BytesView as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}
inline std::string_view as_string(BytesView b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}
inline Bytes to_bytes(std::string_view s) {
  return Bytes(s.begin(), s.end());
}
inline Bytes copy_bytes(BytesView b) {
  return Bytes(b.begin(), b.end());
}

std::string to_hex(BytesView b);
result<Bytes> from_hex(std::string_view s);

// Unsigned LEB128 varint as used by multiformats (max 9 bytes = 63 bits, minimal encoding).
constexpr std::size_t kMaxUvarintLen = 9;
void append_uvarint(Bytes& out, std::uint64_t v);
std::size_t uvarint_size(std::uint64_t v);
// Decodes a varint at the start of `in`. On success returns {value, bytes consumed}.
// Rejects non-minimal encodings and values over 63 bits. Returns errc::closed-free
// std::nullopt if `in` ends before the varint does (need more data).
struct UvarintDecode {
  std::uint64_t value;
  std::size_t length;
};
result<std::optional<UvarintDecode>> decode_uvarint(BytesView in);

// Appends big-endian integers.
void append_be16(Bytes& out, std::uint16_t v);
void append_be32(Bytes& out, std::uint32_t v);
void append_be64(Bytes& out, std::uint64_t v);
std::uint16_t load_be16(const std::uint8_t* p);
std::uint32_t load_be32(const std::uint8_t* p);
std::uint64_t load_be64(const std::uint8_t* p);

}  // namespace starling
