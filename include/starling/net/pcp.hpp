// Port Control Protocol (RFC 6887) messages: the MAP and ANNOUNCE requests a client sends to
// its gateway (UDP port 5351) and the parser of their answers. Pure functions (no I/O), fuzzed
// by fuzz/fuzz_pcp.cpp; the client that uses them is src/net/portmap_pcp.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <asio/ip/address_v4.hpp>

#include "starling/core/bytes.hpp"
#include "starling/core/result.hpp"

namespace starling::net::pcp {

inline constexpr std::uint16_t kServerPort = 5351;
inline constexpr std::uint8_t kVersion = 2;
inline constexpr std::uint8_t kOpAnnounce = 0;
inline constexpr std::uint8_t kOpMap = 1;
inline constexpr std::uint8_t kProtocolTcp = 6;
inline constexpr std::size_t kHeaderSize = 24;
inline constexpr std::size_t kMapSize = 36;
inline constexpr std::size_t kMaxMessage = 1100;  // RFC 6887 §7

using Nonce = std::array<std::uint8_t, 12>;

// The name of a result code (RFC 6887 §7.4: 0 SUCCESS, 1 UNSUPP_VERSION, 2 NOT_AUTHORIZED, ...).
std::string result_name(std::uint8_t code);

struct MapRequest {
  asio::ip::address_v4 client;  // the source address of the request (checked by the server)
  Nonce nonce{};                // identifies the mapping's owner; the same for its renewals
  std::uint8_t protocol = kProtocolTcp;
  std::uint16_t internal_port = 0;
  std::uint16_t suggested_external_port = 0;  // 0: no preference
  std::uint32_t lifetime = 0;                 // seconds; 0 deletes the mapping
};
Bytes encode_map(const MapRequest& r);
Bytes encode_announce(const asio::ip::address_v4& client);

struct Response {
  std::uint8_t opcode = 0;
  std::uint8_t result = 0;
  std::uint32_t lifetime = 0;  // granted seconds (on an error: how long the error holds)
  std::uint32_t epoch = 0;     // the server's epoch time (seconds since its state began)
  // MAP answers only:
  Nonce nonce{};
  std::uint8_t protocol = 0;
  std::uint16_t internal_port = 0;
  std::uint16_t external_port = 0;
  asio::ip::address_v4 external_ip;
};
// Parses an answer. errc::unsupported when the server speaks NAT-PMP only (a version-0
// "unsupported version" answer, RFC 6887 §9); errc::protocol_violation for anything that is
// not a well-formed PCP answer (too short or long, not a multiple of 4, request bit clear,
// an unknown opcode, a MAP answer whose external address is not IPv4-mapped). Options after
// the opcode's fields are skipped.
result<Response> parse_response(BytesView in);

}  // namespace starling::net::pcp
