// Fuzzes the multiaddr parsers (binary and text) and checks round-trip invariants:
// from_bytes(b) ok => to_bytes() == b; parse(s) ok => parse(to_string()) == the same value.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "starling/net/multiaddr.hpp"

using starling::BytesView;
using starling::net::Multiaddr;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

// Invariants that hold for every successfully parsed multiaddr.
void check_value(const Multiaddr& ma) {
  auto text = ma.to_string();
  auto reparsed = Multiaddr::parse(text);
  check(reparsed && reparsed.value() == ma);
  check(reparsed.value().to_string() == text);
  auto bin = ma.to_bytes();
  auto decoded = Multiaddr::from_bytes(bin);
  check(decoded && decoded.value() == ma);
  // Helpers must not crash and must agree with each other.
  auto id = ma.peer_id();
  auto stripped = ma.without_peer_id();
  if (id) {
    check(stripped.components().size() + 1 == ma.components().size());
    check(ma.with_peer_id(*id) == ma);  // replacing the trailing /p2p with itself
  } else {
    check(stripped == ma);
  }
  if (auto ep = ma.to_tcp_endpoint()) {
    // from_tcp_endpoint() turns an IPv4-mapped IPv6 address (::ffff:a.b.c.d, what a dual-stack
    // socket reports for an IPv4 peer) into /ip4 on purpose: expect the IPv4 endpoint then.
    auto want = ep.value();
    if (want.address().is_v6() && want.address().to_v6().is_v4_mapped())
      want = {asio::ip::make_address_v4(asio::ip::v4_mapped, want.address().to_v6()), want.port()};
    check(Multiaddr::from_tcp_endpoint(ep.value()).to_tcp_endpoint().value() == want);
  }
  (void)ma.dns_tcp();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  BytesView bytes(data, size);
  if (auto ma = Multiaddr::from_bytes(bytes)) {
    check(ma.value().to_bytes() == starling::Bytes(bytes.begin(), bytes.end()));
    check_value(ma.value());
  }
  if (auto ma = Multiaddr::parse(starling::as_string(bytes))) {
    check(!ma.value().empty());
    check_value(ma.value());
  }
  return 0;
}
