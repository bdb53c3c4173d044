// Host: admission of inbound connections at the connection limits, with eviction of stale
// handshakes and idle inbound connections, so idle connects cannot lock real peers out.
#include "host_internal.hpp"
#include "starling/core/log.hpp"

namespace starling::net {
bool Host::evict_pending_handshake(TimePoint now) {
  // The map is ordered by start: the first live entry past the grace is the oldest.
  for (auto& [id, p] : pending_inbound_) {
    if (now - p->started < cfg_.pending_inbound_grace) return false;
    if (p->evicted) continue;  // already closing
    auto tcp = p->tcp.lock();
    if (!tcp) continue;
    p->evicted = true;
    ++stats_.evicted_handshakes;
    logger("net")->debug(
        "evicting handshake from {} (pending {} ms) to admit a new connection", tcp->describe(),
        std::chrono::duration_cast<std::chrono::milliseconds>(now - p->started).count());
    tcp->reset();  // the handshake's next read fails and handle_inbound cleans up
    return true;
  }
  return false;
}

bool Host::evict_idle_inbound(TimePoint now) {
  // The inbound connection without streams idle the longest (not kept alive by a protocol).
  std::shared_ptr<Connection> victim;
  for (auto& [peer, v] : conns_) {
    if (keep_alive_.count(peer)) continue;
    for (auto& c : v)
      if (!c->closed && !c->outbound && c->session->stream_count() == 0 &&
          now - c->last_active >= cfg_.pending_inbound_grace &&
          (!victim || c->last_active < victim->last_active))
        victim = c;
  }
  if (!victim) return false;
  ++stats_.evicted_connections;
  logger("net")->info("evicting idle inbound connection from {} to admit a new connection",
                      victim->peer.short_string());
  victim->closed = true;
  scope_.spawn(victim->session->close());
  return true;
}

bool Host::admit_inbound() {
  const auto now = Clock::now();
  // Connections being evicted still sit in conns_ until their session ends: count live ones.
  std::size_t live = 0;
  for (auto& [peer, v] : conns_)
    for (auto& c : v) live += c->closed ? 0 : 1;
  if (pending_inbound_.size() >= cfg_.max_pending_inbound && !evict_pending_handshake(now)) {
    log_refusal(live);
    return false;
  }
  if (live >= cfg_.max_connections && !evict_idle_inbound(now)) {
    log_refusal(live);
    return false;
  }
  return true;
}

void Host::log_refusal(std::size_t live) {
  const auto n = refusal_log_.note(Clock::now());
  if (n == 0) return;
  logger("net")->warn(
      "refused {} inbound connection(s): limit reached ({} connections, {} handshaking; "
      "nothing idle to evict)",
      n, live, pending_inbound_.size());
}

}  // namespace starling::net
