// Fuzzes the AutoNAT v1 parsers: a DIAL request (server side) and a DIAL_RESPONSE (client
// side). Must never crash; accepted addresses must round-trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "starling/net/autonat.hpp"

using namespace starling;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  BytesView in(data, size);
  if (auto d = net::parse_autonat_dial(in)) {
    if (!d.value().peer.valid()) std::abort();
    for (const auto& a : d.value().addrs) {
      auto back = net::Multiaddr::from_bytes(a.to_bytes());
      if (!back || !(back.value() == a)) std::abort();
    }
  }
  if (auto a = net::parse_autonat_answer(in); a && a.value().text.size() > 256) std::abort();
  return 0;
}
