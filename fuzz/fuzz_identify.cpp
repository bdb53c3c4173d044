// Fuzzes what the host does with an identify message from a peer: protobuf parse, public key,
// listen and observed multiaddrs. Must never crash; accepted addresses must round-trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "starling/crypto/keys.hpp"
#include "starling/net/multiaddr.hpp"
#include "starling/net/peer_id.hpp"
#include "starling/pb/identify.pb.h"

using namespace starling;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 64 * 1024) return 0;  // the host rejects larger identify messages up front
  pb::Identify msg;
  if (!msg.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (msg.has_publickey()) {
    auto pk = crypto::PublicKey::from_protobuf(as_bytes(msg.publickey()));
    if (pk) (void)net::PeerId::from_public_key(pk.value()).to_string();
  }
  for (const auto& a : msg.listenaddrs()) {
    auto ma = net::Multiaddr::from_bytes(as_bytes(a));
    if (ma && ma.value().to_bytes() != to_bytes(a)) std::abort();
  }
  if (msg.has_observedaddr()) (void)net::Multiaddr::from_bytes(as_bytes(msg.observedaddr()));
  return 0;
}
