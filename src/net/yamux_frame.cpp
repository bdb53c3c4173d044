#include "net/yamux_frame.hpp"

#include <fmt/format.h>

namespace starling::net::yamux {

void encode_header(const FrameHeader& h, std::uint8_t* out) noexcept {
  out[0] = kVersion;
  out[1] = static_cast<std::uint8_t>(h.type);
  out[2] = static_cast<std::uint8_t>(h.flags >> 8);
  out[3] = static_cast<std::uint8_t>(h.flags);
  out[4] = static_cast<std::uint8_t>(h.stream_id >> 24);
  out[5] = static_cast<std::uint8_t>(h.stream_id >> 16);
  out[6] = static_cast<std::uint8_t>(h.stream_id >> 8);
  out[7] = static_cast<std::uint8_t>(h.stream_id);
  out[8] = static_cast<std::uint8_t>(h.length >> 24);
  out[9] = static_cast<std::uint8_t>(h.length >> 16);
  out[10] = static_cast<std::uint8_t>(h.length >> 8);
  out[11] = static_cast<std::uint8_t>(h.length);
}

result<FrameHeader> decode_header(BytesView in) {
  if (in.size() < kHeaderSize)
    return make_error(errc::invalid_argument, "yamux header needs 12 bytes");
  if (in[0] != kVersion)
    return make_error(errc::protocol_violation,
                      fmt::format("yamux frame with unsupported version {}", in[0]));
  if (in[1] > static_cast<std::uint8_t>(FrameType::go_away))
    return make_error(errc::protocol_violation,
                      fmt::format("yamux frame of unknown type {}", in[1]));
  FrameHeader h;
  h.type = static_cast<FrameType>(in[1]);
  h.flags = load_be16(in.data() + 2);
  h.stream_id = load_be32(in.data() + 4);
  h.length = load_be32(in.data() + 8);
  const bool session_frame = h.type == FrameType::ping || h.type == FrameType::go_away;
  if (session_frame && h.stream_id != 0)
    return make_error(errc::protocol_violation,
                      fmt::format("yamux {} on stream {} (must be 0)", to_string(h), h.stream_id));
  if (!session_frame && h.stream_id == 0)
    return make_error(errc::protocol_violation,
                      fmt::format("yamux {} on the session id 0", to_string(h)));
  return h;
}

std::string to_string(const FrameHeader& h) {
  static constexpr const char* kTypes[] = {"data", "window-update", "ping", "go-away"};
  const auto t = static_cast<unsigned>(h.type);
  std::string flags;
  auto add = [&](std::uint16_t f, const char* name) {
    if (!h.has(f)) return;
    if (!flags.empty()) flags += '|';
    flags += name;
  };
  add(flag::syn, "SYN");
  add(flag::ack, "ACK");
  add(flag::fin, "FIN");
  add(flag::rst, "RST");
  return fmt::format("{} stream={} flags={} length={}", t < 4 ? kTypes[t] : "unknown", h.stream_id,
                     flags.empty() ? "-" : flags, h.length);
}

}  // namespace starling::net::yamux
