// DhtCore: answering requests from other nodes (ping, store, find).
#include <algorithm>

#include "dht_log.hpp"
#include "starling/dht/core.hpp"

namespace starling::dht {

Response DhtCore::handle_request(const net::PeerId& from, const Request& request, const Now& now) {
  std::optional<Contact> newcomer;
  if (from != self_.peer) {
    Contact c{from, DhtId::of_peer(from), request.sender.addrs};
    if (request.sender.client_mode) {
      routing_.remove(c.id);  // clients never enter routing tables
    } else {
      const bool known = routing_.contains(c.id);
      if (!blacklist_.blocked(c.id, now.mono))
        ping_for_eviction(routing_.on_seen(c, now.mono), now);
      // A newcomer: first time in the table, or its self-lookup (a join, maybe a restart with
      // the same identity and an empty store, maybe blacklisted while it was down).
      auto* f = std::get_if<FindRequest>(&request.body);
      const bool self_lookup =
          f && std::find(f->targets.begin(), f->targets.end(), c.id) != f->targets.end();
      if (self_lookup || (!known && routing_.contains(c.id))) newcomer = std::move(c);
    }
  }
  Response resp;
  if (std::holds_alternative<PingRequest>(request.body))
    resp = Response{header(), PingResponse{}};
  else if (auto* s = std::get_if<StoreRequest>(&request.body))
    resp = handle_store(from, *s, now);
  else
    resp = handle_find(from, std::get<FindRequest>(request.body), now);
  if (newcomer) {
    replicate_to(*newcomer, now);  // queued after the answer is computed
    check_growth(now);
  }
  return resp;
}

bool DhtCore::warn_allowed(const net::PeerId& peer, TimePoint now) {
  auto [it, fresh] = warned_.try_emplace(peer, now);
  if (!fresh && now - it->second < cfg_.peer_warning_interval) return false;
  it->second = now;
  if (warned_.size() > 4096)  // forget peers not warned about for a period
    std::erase_if(warned_,
                  [&](const auto& w) { return now - w.second >= cfg_.peer_warning_interval; });
  return true;
}

Response DhtCore::handle_store(const net::PeerId& from, const StoreRequest& req, const Now& now) {
  StoreResponse out;
  const auto ctx = validation_context(now);
  const net::PeerId* source = from == self_.peer ? nullptr : &from;
  std::size_t seen = 0;
  for (const auto& item : req.items) {
    for (Record rec : item.records) {
      if (cfg_.max_records_per_store && ++seen > cfg_.max_records_per_store) {
        if (seen == cfg_.max_records_per_store + 1 && warn_allowed(from, now.mono))
          dht_log().warn("store request from {} carries more than {} records: the rest refused",
                         from.short_string(), cfg_.max_records_per_store);
        out.status.push_back(StoreStatus::full);
        continue;
      }
      if (auto ok = validators_.validate(item.key, rec, ctx); !ok) {
        if (warn_allowed(from, now.mono))
          dht_log().warn("rejected a record from {} for key {}: {}", from.short_string(),
                         item.key.to_string(), ok.error().message());
        out.status.push_back(StoreStatus::rejected);
        continue;
      }
      if (rec.ttl > cfg_.max_ttl) rec.ttl = cfg_.max_ttl;
      auto m = store_.put(item.key, rec.subkey, rec.body, now.mono + rec.ttl, now.mono, source);
      if (!m) {
        if (warn_allowed(from, now.mono))
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
  // Records go out within a byte budget (half a message: peers and framing take the rest),
  // each key at most once: a request naming one big key many times costs one copy, and a
  // target whose records do not fit gets peers only (the getter asks those).
  std::size_t budget = cfg_.limits.max_message_bytes / 2;
  std::vector<DhtId> answered;
  for (const auto& target : req.targets) {
    FindResult r;
    const bool repeated = std::find(answered.begin(), answered.end(), target) != answered.end();
    if (req.want_values && !repeated) {
      answered.push_back(target);
      const Slot* slot = store_.find(target, now.mono);
      if (slot && slot->byte_size() <= budget) {
        budget -= slot->byte_size();
        r.records = store_.records(target, now.mono);
      } else if (slot) {
        dht_log().debug("find from {}: records of {} ({} bytes) left out of the answer",
                        from.short_string(), to_hex(target.bytes()).substr(0, 12),
                        slot->byte_size());
      }
    }
    // Peers, unless the requester ends at the plain value this answer carries.
    const bool plain_value =
        !r.records.empty() &&
        std::none_of(r.records.begin(), r.records.end(), [](const Record& x) { return x.subkey; });
    if (!plain_value || !req.value_suffices)
      for (auto& c : routing_.closest(target, peers, requester))
        r.peers.push_back(PeerInfo{std::move(c.peer), std::move(c.addrs)});
    out.results.push_back(std::move(r));
  }
  return Response{header(), std::move(out)};
}

}  // namespace starling::dht
