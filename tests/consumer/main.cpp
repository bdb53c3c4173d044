// Uses the installed library: creates a key, prints its peer id, parses a multiaddr.
#include <iostream>

#include "starling/net/multiaddr.hpp"
#include "starling/net/peer_id.hpp"

int main() {
  auto key = starling::crypto::KeyPair::generate();
  auto id = starling::net::PeerId::from_public_key(key.public_key());
  auto ma = starling::net::Multiaddr::parse("/ip4/127.0.0.1/tcp/4001");
  if (!ma) return 1;
  std::cout << ma.value().with_peer_id(id).to_string() << "\n";
  return id.to_string().rfind("12D3KooW", 0) == 0 ? 0 : 1;
}
