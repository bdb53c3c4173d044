// Yamux frame header codec (pure, no I/O): the 12-byte header of hashicorp/yamux spec.md —
// version (8 bits, always 0), type (8), flags (16), stream id (32), length (32), big-endian.
// Thread-agnostic (no state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "starling/core/bytes.hpp"

namespace starling::net::yamux {

inline constexpr std::size_t kHeaderSize = 12;
inline constexpr std::uint8_t kVersion = 0;
// Every stream starts with this receive window on both sides (spec "Flow Control").
inline constexpr std::uint32_t kInitialWindow = 256 * 1024;

enum class FrameType : std::uint8_t { data = 0, window_update = 1, ping = 2, go_away = 3 };

namespace flag {
inline constexpr std::uint16_t syn = 0x1;
inline constexpr std::uint16_t ack = 0x2;
inline constexpr std::uint16_t fin = 0x4;
inline constexpr std::uint16_t rst = 0x8;
}  // namespace flag

struct FrameHeader {
  FrameType type = FrameType::data;
  std::uint16_t flags = 0;
  std::uint32_t stream_id = 0;
  // Data: payload length; window update: delta; ping: opaque value; go-away: error code.
  std::uint32_t length = 0;

  bool has(std::uint16_t f) const noexcept { return (flags & f) != 0; }
  friend bool operator==(const FrameHeader&, const FrameHeader&) = default;
};

// Writes the 12-byte encoding of `h` to `out`.
void encode_header(const FrameHeader& h, std::uint8_t* out) noexcept;

// Decodes the first 12 bytes of `in` (which must hold at least 12) and checks what the
// header alone can tell: version 0, a known type, stream id 0 for
// ping/go-away and non-zero for data/window update (else errc::protocol_violation).
// Unknown flag bits are ignored (as go-yamux does).
result<FrameHeader> decode_header(BytesView in);

// "data stream=5 flags=SYN|FIN length=42" for logs.
std::string to_string(const FrameHeader& h);

}  // namespace starling::net::yamux
