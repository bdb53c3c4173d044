// PCP message layout (RFC 6887 §7.1 request header, §7.2 response header, §11.1 MAP opcode).
// Addresses are 16 bytes; IPv4 ones are IPv4-mapped (::ffff:a.b.c.d).
#include "starling/net/pcp.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace starling::net::pcp {

namespace {

void append_v4_mapped(Bytes& out, const asio::ip::address_v4& a) {
  out.insert(out.end(), 10, 0);
  out.push_back(0xff);
  out.push_back(0xff);
  const auto b = a.to_bytes();
  out.insert(out.end(), b.begin(), b.end());
}

Bytes header(std::uint8_t opcode, std::uint32_t lifetime, const asio::ip::address_v4& client) {
  Bytes out;
  out.reserve(kHeaderSize + kMapSize);
  out.push_back(kVersion);
  out.push_back(opcode);  // R bit clear: a request
  out.push_back(0);
  out.push_back(0);
  append_be32(out, lifetime);
  append_v4_mapped(out, client);
  return out;
}

}  // namespace

std::string result_name(std::uint8_t code) {
  static constexpr const char* kNames[] = {
      "SUCCESS",          "UNSUPP_VERSION",        "NOT_AUTHORIZED",   "MALFORMED_REQUEST",
      "UNSUPP_OPCODE",    "UNSUPP_OPTION",         "MALFORMED_OPTION", "NETWORK_FAILURE",
      "NO_RESOURCES",     "UNSUPP_PROTOCOL",       "USER_EX_QUOTA",    "CANNOT_PROVIDE_EXTERNAL",
      "ADDRESS_MISMATCH", "EXCESSIVE_REMOTE_PEERS"};
  if (code < std::size(kNames)) return fmt::format("{} ({})", kNames[code], code);
  return fmt::format("result code {}", code);
}

Bytes encode_map(const MapRequest& r) {
  Bytes out = header(kOpMap, r.lifetime, r.client);
  out.insert(out.end(), r.nonce.begin(), r.nonce.end());
  out.push_back(r.protocol);
  out.insert(out.end(), 3, 0);
  append_be16(out, r.internal_port);
  append_be16(out, r.suggested_external_port);
  append_v4_mapped(out, asio::ip::address_v4::any());  // no preferred external address
  return out;
}

Bytes encode_announce(const asio::ip::address_v4& client) {
  return header(kOpAnnounce, 0, client);
}

result<Response> parse_response(BytesView in) {
  // A NAT-PMP server answers a version it does not know with its own 8-byte error (version 0).
  if (in.size() >= 4 && in[0] == 0)
    return make_error(errc::unsupported, "PCP: the gateway speaks NAT-PMP only (version 0)");
  if (in.size() < kHeaderSize || in.size() > kMaxMessage || in.size() % 4 != 0)
    return make_error(errc::protocol_violation,
                      fmt::format("PCP: an answer of {} bytes", in.size()));
  if (in[0] != kVersion)
    return make_error(errc::protocol_violation, fmt::format("PCP: version {}", in[0]));
  if ((in[1] & 0x80) == 0)
    return make_error(errc::protocol_violation, "PCP: a request where an answer was expected");
  Response r;
  r.opcode = in[1] & 0x7f;
  r.result = in[3];
  r.lifetime = load_be32(in.data() + 4);
  r.epoch = load_be32(in.data() + 8);
  if (r.opcode == kOpAnnounce) return r;
  if (r.opcode != kOpMap)
    return make_error(errc::protocol_violation, fmt::format("PCP: opcode {}", r.opcode));
  if (in.size() < kHeaderSize + kMapSize) {
    // An error answer may omit the opcode's fields only if it could not parse them; without
    // them there is no nonce to match, so it cannot be ours.
    return make_error(errc::protocol_violation, "PCP: a MAP answer without its fields");
  }
  const std::uint8_t* p = in.data() + kHeaderSize;
  std::copy(p, p + 12, r.nonce.begin());
  r.protocol = p[12];
  r.internal_port = load_be16(p + 16);
  r.external_port = load_be16(p + 18);
  const std::uint8_t* a = p + 20;
  const bool mapped = std::all_of(a, a + 10, [](std::uint8_t b) { return b == 0; }) &&
                      a[10] == 0xff && a[11] == 0xff;
  if (!mapped && r.result == 0)  // SUCCESS
    return make_error(errc::protocol_violation, "PCP: the external address is not IPv4");
  if (mapped) r.external_ip = asio::ip::address_v4({a[12], a[13], a[14], a[15]});
  return r;
}

}  // namespace starling::net::pcp
