// Multiaddrs: text (/ip4/1.2.3.4/tcp/4001/p2p/12D3KooW...) and binary (varint protocol code +
// value) forms. Supported protocols: ip4, ip6, dns, dns4, dns6, dnsaddr, tcp, udp, p2p (alias
// ipfs), p2p-circuit, quic, quic-v1, ws, wss; unknown or malformed components are rejected with
// the reason (errc::invalid_argument; errc::too_large over kMaxMultiaddrSize).
// Codes from multiformats/multiaddr protocols.csv. A Multiaddr only ever holds valid components
// (it is built by the parsers or the helpers below). Threading: plain values, any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <asio/ip/tcp.hpp>

#include "starling/core/bytes.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::net {

// clang-format off
enum class Proto : std::uint32_t {
  ip4 = 0x04, tcp = 0x06, udp = 0x0111, dns = 0x35, dns4 = 0x36, dns6 = 0x37,
  dnsaddr = 0x38, ip6 = 0x29, p2p = 0x01a5, p2p_circuit = 0x0122, quic = 0x01cc,
  quic_v1 = 0x01cd, ws = 0x01dd, wss = 0x01de,
};
// clang-format on

// Limits on accepted encodings (a multiaddr in the wild is well under 300 bytes).
constexpr std::size_t kMaxMultiaddrSize = 1024;  // binary form
// Text form: must admit the printed form of every accepted binary form (the worst case is
// "/p2p-circuit", 12 characters for 2 bytes); the parsed result must still fit kMaxMultiaddrSize.
constexpr std::size_t kMaxMultiaddrTextSize = 8 * kMaxMultiaddrSize;
constexpr std::size_t kMaxDnsNameSize = 255;

// The text name of a protocol ("ip4", "p2p-circuit", ...).
std::string_view proto_name(Proto p);

struct MultiaddrComponent {
  Proto proto;
  Bytes value;  // binary value (empty for ws, wss, p2p-circuit, quic-v1)
  friend bool operator==(const MultiaddrComponent&, const MultiaddrComponent&) = default;
};

class Multiaddr {
 public:
  Multiaddr() = default;
  static result<Multiaddr> parse(std::string_view text);
  static result<Multiaddr> from_bytes(BytesView bytes);
  // /ip4/a.b.c.d/tcp/p or /ip6/.../tcp/p; IPv4-mapped IPv6 becomes /ip4; the scope id is dropped.
  static Multiaddr from_tcp_endpoint(const asio::ip::tcp::endpoint& ep);

  std::string to_string() const;
  Bytes to_bytes() const;
  const std::vector<MultiaddrComponent>& components() const noexcept { return parts_; }
  bool empty() const noexcept { return parts_.empty(); }

  // The trailing /p2p/<id>, if any.
  std::optional<PeerId> peer_id() const;
  Multiaddr with_peer_id(
      const PeerId& id) const;  // replaces/appends /p2p/<id> (invalid id: removes)
  Multiaddr without_peer_id() const;
  // ip4|ip6 + tcp (optionally followed by /p2p) -> endpoint; errc::unsupported otherwise.
  result<asio::ip::tcp::endpoint> to_tcp_endpoint() const;
  // dns|dns4|dns6 host + tcp port (optionally followed by /p2p), if this is a DNS multiaddr.
  std::optional<std::pair<std::string, std::uint16_t>> dns_tcp() const;

  // Circuit relay addresses: <relay addr>/p2p/<relay>/p2p-circuit[/p2p/<target>].
  bool is_circuit() const;
  // The relay part (everything before /p2p-circuit, ending in /p2p/<relay>) and the target
  // peer if given; errc::invalid_argument for any other shape (nested circuits included).
  result<std::pair<Multiaddr, std::optional<PeerId>>> circuit_parts() const;
  Multiaddr with_circuit() const;  // appends /p2p-circuit

  friend bool operator==(const Multiaddr&, const Multiaddr&) = default;

 private:
  std::vector<MultiaddrComponent> parts_;
};

}  // namespace starling::net
