// DhtCore: answering requests from other nodes (ping, store, find).
#include "dht_log.hpp"
#include "starling/dht/core.hpp"

namespace starling::dht {

Response DhtCore::handle_request(const net::PeerId& from, const Request& request, const Now& now) {
  if (from != self_.peer) {
    Contact c{from, DhtId::of_peer(from), request.sender.addrs};
    if (request.sender.client_mode)
      routing_.remove(c.id);  // clients never enter routing tables
    else if (!blacklist_.blocked(c.id, now.mono))
      ping_for_eviction(routing_.on_seen(c, now.mono), now);
  }
  if (std::holds_alternative<PingRequest>(request.body)) return Response{header(), PingResponse{}};
  if (auto* s = std::get_if<StoreRequest>(&request.body)) return handle_store(from, *s, now);
  return handle_find(from, std::get<FindRequest>(request.body), now);
}

Response DhtCore::handle_store(const net::PeerId& from, const StoreRequest& req, const Now& now) {
  StoreResponse out;
  const auto ctx = validation_context(now);
  for (const auto& item : req.items) {
    for (Record rec : item.records) {
      if (auto ok = validators_.validate(item.key, rec, ctx); !ok) {
        dht_log().warn("rejected a record from {} for key {}: {}", from.short_string(),
                       item.key.to_string(), ok.error().message());
        out.status.push_back(StoreStatus::rejected);
        continue;
      }
      if (rec.ttl > cfg_.max_ttl) rec.ttl = cfg_.max_ttl;
      auto m = store_.put(item.key, rec.subkey, rec.body, now.mono + rec.ttl, now.mono);
      if (!m) {
        dht_log().warn("could not store a record from {} for key {}: {}", from.short_string(),
                       item.key.to_string(), m.error().message());
        out.status.push_back(m.error() == dht_errc::capacity ? StoreStatus::full
                                                             : StoreStatus::rejected);
      } else {
        out.status.push_back(m.value() == MergeResult::stale ? StoreStatus::stale
                                                             : StoreStatus::accepted);
      }
    }
  }
  return Response{header(), std::move(out)};
}

Response DhtCore::handle_find(const net::PeerId& from, const FindRequest& req, const Now& now) {
  FindResponse out;
  const DhtId requester = DhtId::of_peer(from);
  const std::size_t peers = std::min(cfg_.k, cfg_.limits.max_peers_per_target);
  for (const auto& target : req.targets) {
    FindResult r;
    for (auto& c : routing_.closest(target, peers, requester))
      r.peers.push_back(PeerInfo{std::move(c.peer), std::move(c.addrs)});
    if (req.want_values) r.records = store_.records(target, now.mono);
    out.results.push_back(std::move(r));
  }
  return Response{header(), std::move(out)};
}

}  // namespace starling::dht
