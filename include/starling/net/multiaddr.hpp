// Multiaddrs: text (/ip4/1.2.3.4/tcp/4001/p2p/12D3KooW...) and binary (varint protocol code +
// value) forms. Supported protocols: ip4, ip6, dns, dns4, dns6, dnsaddr, tcp, udp, p2p (alias
// ipfs), p2p-circuit, quic-v1, ws, wss; unknown or malformed components are rejected with the
// reason.
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

enum class Proto : std::uint32_t {
  ip4 = 0x04, tcp = 0x06, udp = 0x0111, dns = 0x35, dns4 = 0x36, dns6 = 0x37,
  dnsaddr = 0x38, ip6 = 0x29, p2p = 0x01a5, p2p_circuit = 0x0122, quic_v1 = 0x01cc,
  ws = 0x01dd, wss = 0x01de,
};

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
  static Multiaddr from_tcp_endpoint(const asio::ip::tcp::endpoint& ep);

  std::string to_string() const;
  Bytes to_bytes() const;
  const std::vector<MultiaddrComponent>& components() const noexcept { return parts_; }
  bool empty() const noexcept { return parts_.empty(); }

  // The trailing /p2p/<id>, if any.
  std::optional<PeerId> peer_id() const;
  Multiaddr with_peer_id(const PeerId& id) const;  // replaces/appends /p2p/<id>
  Multiaddr without_peer_id() const;
  // ip4|ip6 + tcp (optionally followed by /p2p) -> endpoint; errc::unsupported otherwise.
  result<asio::ip::tcp::endpoint> to_tcp_endpoint() const;
  // dns|dns4|dns6 host + tcp port, if this is a DNS multiaddr.
  std::optional<std::pair<std::string, std::uint16_t>> dns_tcp() const;

  friend bool operator==(const Multiaddr&, const Multiaddr&) = default;

 private:
  std::vector<MultiaddrComponent> parts_;
};

}  // namespace starling::net
