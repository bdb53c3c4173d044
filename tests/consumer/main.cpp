// Uses the installed library: creates a key, prints its peer id, parses a multiaddr.
#include <iostream>

#include "starling/net/multiaddr.hpp"
#include "starling/net/peer_id.hpp"

// Code that Starling's own flags reject (-Wall -Wextra -Werror: an unused variable): it builds
// here only because the installed targets do not pass those flags on to their users.
static int starling_flags_stay_private() {
  int unused_on_purpose = 0;
  return 1;
}

int main() {
  if (starling_flags_stay_private() != 1) return 1;
  auto key = starling::crypto::KeyPair::generate();
  auto id = starling::net::PeerId::from_public_key(key.public_key());
  auto ma = starling::net::Multiaddr::parse("/ip4/127.0.0.1/tcp/4001");
  if (!ma) return 1;
  std::cout << ma.value().with_peer_id(id).to_string() << "\n";
  return id.to_string().rfind("12D3KooW", 0) == 0 ? 0 : 1;
}
