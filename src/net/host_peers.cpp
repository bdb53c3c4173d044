// Host: the peer table (what we know about peers: addresses, identify info), bounded by
// HostConfig::max_known_peers. Past the cap the least recently useful peer without an open
// connection, a dial in progress or keep-alive is forgotten; peers we had a connection with
// ("met") and hearsay-only peers each keep at least half the table when both compete.
#include <algorithm>

#include "host_internal.hpp"
#include "starling/core/log.hpp"

namespace starling::net {

PeerInfo& Host::touch_peer(const PeerId& peer, bool met) {
  auto [it, fresh] = peers_.try_emplace(peer);
  auto& row = it->second;
  if (!fresh) (row.met ? met_by_use_ : unmet_by_use_).erase(row.used);
  row.met = row.met || met;
  row.used = next_use_++;
  (row.met ? met_by_use_ : unmet_by_use_).emplace(row.used, peer);
  trim_peers(peer);  // a new row, or a peer no longer pinned, may leave the table above cap
  return row.info;
}

bool Host::peer_pinned(const PeerId& peer) const {
  return conns_.count(peer) > 0 || dialing_.count(peer) > 0 || keep_alive_.count(peer) > 0;
}

// Forgets the least recently useful unpinned peer of `order` other than `keep`. The scan
// passes over pinned peers only: at most the connected, dialling and kept-alive ones.
bool Host::forget_oldest(std::map<std::uint64_t, PeerId>& order, const PeerId& keep) {
  for (auto it = order.begin(); it != order.end(); ++it) {
    const PeerId& p = it->second;
    if (p == keep || peer_pinned(p)) continue;
    addr_book_.forget(p);
    peers_.erase(p);
    order.erase(it);
    ++stats_.forgotten_peers;
    if (const auto n = forget_log_.note(Clock::now()))
      logger("net")->info(
          "forgot {} peer(s) without a connection, least recently useful first: the peer "
          "table is at max_known_peers ({})",
          n, cfg_.max_known_peers);
    return true;
  }
  return false;
}

void Host::trim_peers(const PeerId& keep) {
  const std::size_t cap = std::max<std::size_t>(cfg_.max_known_peers, 1);
  while (peers_.size() > cap) {
    // The kind holding more than half the table gives up its oldest first.
    const bool hearsay_first = unmet_by_use_.size() > cap / 2;
    auto& first = hearsay_first ? unmet_by_use_ : met_by_use_;
    auto& second = hearsay_first ? met_by_use_ : unmet_by_use_;
    if (!forget_oldest(first, keep) && !forget_oldest(second, keep)) return;  // all pinned
  }
}

void Host::add_addresses(const PeerId& peer, const std::vector<Multiaddr>& addrs,
                         AddrSource source) {
  std::vector<Multiaddr> bare;
  bare.reserve(std::min(addrs.size(), addr_book_.cap()));
  for (const auto& a : addrs) {
    if (bare.size() == addr_book_.cap()) break;  // the book would drop the rest anyway
    bare.push_back(a.without_peer_id());
  }
  auto& info = touch_peer(peer, source == AddrSource::dialed);
  info.addrs = addr_book_.add(peer, bare, source);
}

std::optional<PeerInfo> Host::peer_info(const PeerId& peer) const {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return std::nullopt;
  return it->second.info;
}

}  // namespace starling::net
