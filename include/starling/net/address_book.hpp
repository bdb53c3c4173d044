// AddressBook: where a Host's peers listen, at most `cap` addresses per peer (HostConfig::
// max_addrs_per_peer, 16), so a hostile peer or gossip about it cannot bloat memory or make
// a dial crawl through thousands of addresses.
//
// Ranking, best first (dials try addresses in this order): addresses confirmed by a
// successful dial, then those the peer announced itself (identify), then hearsay (other
// peers, callers); within one kind the most recently confirmed first, and within one batch
// the order given. An address keeps the best kind it was ever learned as; a later report of
// a lesser kind does not move it. When a peer has more than `cap`, the lowest ranked go:
// hearsay never displaces an address the peer or a dial confirmed.
//
// Threading rule: plain state, no locks; owned by the Host (its executor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "starling/net/multiaddr.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::net {

enum class AddrSource : std::uint8_t { hearsay = 0, peer = 1, dialed = 2 };

inline constexpr std::size_t kMaxAddrsPerPeer = 16;

class AddressBook {
 public:
  explicit AddressBook(std::size_t cap = kMaxAddrsPerPeer) : cap_(cap == 0 ? 1 : cap) {}

  // Adds or refreshes `addrs` (without /p2p suffix) for `peer`; returns its addresses now,
  // best first.
  const std::vector<Multiaddr>& add(const PeerId& peer, const std::vector<Multiaddr>& addrs,
                                    AddrSource source);
  // The peer's addresses, best first (empty if unknown).
  const std::vector<Multiaddr>& addrs(const PeerId& peer) const;
  void forget(const PeerId& peer) { book_.erase(peer); }
  std::size_t cap() const noexcept { return cap_; }
  std::size_t size() const noexcept { return book_.size(); }  // peers with addresses

 private:
  struct Entry {
    Multiaddr addr;
    AddrSource source;
    std::uint64_t batch;  // larger: confirmed more recently
    std::size_t index;    // position within its batch
  };
  struct Peer {
    std::vector<Entry> entries;   // ranked
    std::vector<Multiaddr> view;  // entries' addresses, same order
  };

  std::size_t cap_;
  std::uint64_t next_batch_ = 1;
  std::map<PeerId, Peer> book_;
};

}  // namespace starling::net
