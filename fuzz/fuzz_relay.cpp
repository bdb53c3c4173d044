// Fuzzes the circuit relay v2 parsers: hop and stop messages (as the relay service, the
// relay client and the /p2p-circuit dialer read them), reservation addresses and vouchers.
// Must never crash; a voucher that opens must name a relay whose key signed it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "net/relay_internal.hpp"
#include "starling/net/multiaddr.hpp"

using namespace starling;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  BytesView in(data, size);
  if (auto hop = net::parse_hop(in)) {
    const auto& m = hop.value();
    if (m.has_peer()) (void)net::PeerId::from_bytes(as_bytes(m.peer().id()));
    if (m.has_reservation()) {
      for (const auto& a : m.reservation().addrs()) {
        auto ma = net::Multiaddr::from_bytes(as_bytes(a));
        if (ma) (void)ma.value().with_circuit().circuit_parts();
      }
      if (m.reservation().has_voucher()) {
        auto v = net::open_voucher(as_bytes(m.reservation().voucher()));
        if (v && !v.value().relay.valid()) std::abort();
      }
    }
    (void)net::relay_status_name(m.status());
  }
  if (auto stop = net::parse_stop(in); stop && stop.value().has_peer())
    (void)net::PeerId::from_bytes(as_bytes(stop.value().peer().id()));
  if (auto v = net::open_voucher(in); v && !v.value().peer.valid()) std::abort();
  return 0;
}
