// Fuzzes what the host does with an identify message from a peer: protobuf parse, public key,
// listen and observed multiaddrs, and the address book they go into. Must never crash;
// accepted addresses must round-trip; the book keeps at most its cap, without duplicates.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "starling/crypto/keys.hpp"
#include "starling/net/address_book.hpp"
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
  std::vector<net::Multiaddr> accepted;
  for (const auto& a : msg.listenaddrs()) {
    auto ma = net::Multiaddr::from_bytes(as_bytes(a));
    if (ma && ma.value().to_bytes() != to_bytes(a)) std::abort();
    if (ma) accepted.push_back(ma.value());
  }
  // As the host does: a batch of hearsay, then the peer's own announcement.
  net::AddressBook book(4);
  static const net::PeerId peer =
      net::PeerId::from_public_key(crypto::KeyPair::from_seed(Bytes(32, 7)).value().public_key());
  book.add(peer, accepted, net::AddrSource::hearsay);
  std::reverse(accepted.begin(), accepted.end());
  const auto& kept = book.add(peer, accepted, net::AddrSource::peer);
  if (kept.size() > book.cap()) std::abort();
  for (std::size_t i = 0; i < kept.size(); ++i)
    for (std::size_t j = i + 1; j < kept.size(); ++j)
      if (kept[i] == kept[j]) std::abort();
  if (msg.has_observedaddr()) (void)net::Multiaddr::from_bytes(as_bytes(msg.observedaddr()));
  return 0;
}
