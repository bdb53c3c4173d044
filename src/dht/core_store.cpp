// DhtCore: store operations, caching along the lookup path, and the store side of republishing.
#include "dht_log.hpp"
#include "starling/dht/core.hpp"

namespace starling::dht {

result<void> DhtCore::accept_records(const RecordKey& key, std::vector<Record>& records,
                                     const Now& now) const {
  const auto ctx = validation_context(now);
  for (auto& r : records) {
    ST_TRY(validators_.validate(key, r, ctx));
    if (r.ttl > cfg_.max_ttl) r.ttl = cfg_.max_ttl;
  }
  return success();
}

OpId DhtCore::store(const RecordKey& key, std::vector<Record> records, StoreOptions options,
                    const Now& now) {
  const std::size_t replicas = options.replicas ? options.replicas : cfg_.effective_replicas();
  auto invalid = [&](Error e) {
    Operation& op = new_op(OpKind::store, false, now);
    op.key = key;
    const std::uint64_t id = op.id;
    finish(id, e.with_context("store " + key.to_string()), now);
    return OpId{id};
  };
  if (records.empty()) return invalid(make_error(errc::invalid_argument, "no records"));
  if (auto ok = accept_records(key, records, now); !ok) return invalid(ok.error());
  Slot payload;
  for (const auto& r : records) payload.merge(r.subkey, r.body, now.mono + r.ttl);
  if (options.republish && cfg_.republish_interval.count() > 0) {
    auto [it, fresh] = own_.try_emplace(key.id());
    if (fresh) {
      it->second.key = key;
      it->second.next_republish = now.mono + cfg_.republish_interval;
    }
    it->second.slot.merge_all(payload);
  }
  const std::size_t quorum =
      options.quorum ? std::min(options.quorum, replicas) : cfg_.effective_store_quorum(replicas);
  return OpId{start_store(key, std::move(payload), replicas, quorum, false, now)};
}

std::uint64_t DhtCore::start_store(const RecordKey& key, Slot payload, std::size_t replicas,
                                   std::size_t quorum, bool internal, const Now& now) {
  Operation& op = new_op(OpKind::store, internal, now);
  const std::uint64_t id = op.id;
  op.key = key;
  op.replicas = replicas ? replicas : 1;
  op.store_quorum = quorum ? quorum : 1;
  op.found = std::move(payload);
  auto cached = store_cache_.find(key.id());
  if (cached != store_cache_.end() && cached->second.until > now.mono &&
      cached->second.replicas == op.replicas) {
    op.from_cache = true;
    const StoreCache c = cached->second;
    store_on(op, c.targets, c.local, now);
    return id;
  }
  start_lookup(op, key.id(), {}, now, cfg_.effective_store_beam(op.replicas),
               cfg_.effective_store_alpha(op.replicas));
  pump(id, now);
  return id;
}

void DhtCore::send_store(Operation& op, const Contact& to, const Now& now) {
  auto records = op.found.to_records(now.mono);
  if (records.empty() || !op.store_acks.emplace(to.id, StoreAck::pending).second) return;
  // Receivers take at most max_records_per_store records per request: a bigger payload (a
  // republish of many sub-keys of one key) goes in several; the first one's answer is the
  // replica's acknowledgement, the others are sent like replication pushes.
  const std::size_t per = cfg_.max_records_per_store ? cfg_.max_records_per_store : records.size();
  for (std::size_t first = 0; first < records.size(); first += per) {
    StoreRequest req;
    const auto end =
        records.begin() + static_cast<std::ptrdiff_t>(std::min(first + per, records.size()));
    req.items.push_back(
        StoreItem{op.key,
                  {std::make_move_iterator(records.begin() + static_cast<std::ptrdiff_t>(first)),
                   std::make_move_iterator(end)}});
    send(to, std::move(req), first == 0 ? Purpose::store : Purpose::replicate,
         first == 0 ? op.id : 0, now);
  }
}

void DhtCore::store_early(Operation& op, const Contact& from, const Now& now) {
  // `from` just answered the lookup: if it is among the `replicas` closest nodes known that
  // did not fail (this node counted too when it is closer), it very likely stays there, so it
  // gets the records now instead of a round later. One displaced later holds an extra copy.
  if (!cfg_.store_early) return;
  const bool self_closer = !cfg_.client_mode && closer(op.key.id(), self_.id, from.id);
  if (op.lookup->rank(from.id) + (self_closer ? 1 : 0) < op.replicas) send_store(op, from, now);
}

void DhtCore::start_store_phase(Operation& op, const Now& now) {
  auto targets = op.lookup->closest_responded(op.replicas);
  // This node is one of the replicas if it is among the closest (client nodes never are).
  const bool local = !cfg_.client_mode && (targets.size() < op.replicas ||
                                           closer(op.key.id(), self_.id, targets.back().id));
  if (local && targets.size() >= op.replicas) targets.pop_back();
  if (cfg_.store_cache_ttl.count() > 0 &&
      (store_cache_.size() < cfg_.store_cache_keys || store_cache_.count(op.key.id())))
    store_cache_[op.key.id()] =
        StoreCache{targets, local, op.replicas, now.mono + cfg_.store_cache_ttl};
  store_on(op, targets, local, now);
}

void DhtCore::store_on(Operation& op, std::vector<Contact> targets, bool local, const Now& now) {
  op.storing = true;
  add_holders(op, targets, local);
  const std::uint64_t id = op.id;
  auto records = op.found.to_records(now.mono);
  if (records.empty()) {
    finish(id,
           make_error(dht_errc::expired,
                      "store " + op.key.to_string() + ": expired before it was sent"),
           now);
    return;
  }
  if (local) {
    bool held = false, refused = false;
    for (const auto& r : records) {
      auto m = store_.put(op.key, r.subkey, r.body, now.mono + r.ttl, now.mono);
      if (m && m.value() != MergeResult::stale) held = true;
      if (m && m.value() == MergeResult::stale) refused = true;
    }
    op.local_ack = held ? StoreAck::held : refused ? StoreAck::refused : StoreAck::failed;
    if (held || refused)
      if (Holders* h = holders_of(op.key.id(), true)) h->local = true;
  }
  op.store_targets.clear();
  for (const auto& t : targets) {
    op.store_targets.push_back(t.id);
    send_store(op, t, now);  // unless it got them early
  }
  check_store(id, now);
}

void DhtCore::on_store_answer(std::uint64_t id, const Contact& from, StoreAck ack, const Now& now) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  note_holder(it->second.key.id(), from, ack);
  auto a = it->second.store_acks.find(from.id);
  if (a == it->second.store_acks.end() || a->second != StoreAck::pending) return;
  a->second = ack;
  check_store(id, now);
}

StoreAck DhtCore::store_ack_of(const StoreResponse& resp) {
  bool held = false, stale = false;
  for (auto st : resp.status) {
    if (st == StoreStatus::accepted) held = true;
    if (st == StoreStatus::stale) stale = true;
  }
  return held ? StoreAck::held : stale ? StoreAck::refused : StoreAck::failed;
}

void DhtCore::check_store(std::uint64_t id, const Now& now) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  Operation& op = it->second;
  if (!op.storing) return;  // early answers count once the final replicas are known
  std::size_t waiting = 0;
  op.stored = op.local_ack == StoreAck::held ? 1 : 0;
  op.refused = op.local_ack == StoreAck::refused ? 1 : 0;
  for (const auto& t : op.store_targets) {
    switch (op.store_acks.at(t)) {
      case StoreAck::pending:
        ++waiting;
        break;
      case StoreAck::held:
        ++op.stored;
        break;
      case StoreAck::refused:
        ++op.refused;
        break;
      case StoreAck::failed:
        break;
    }
  }
  if (waiting == 0 && op.from_cache && op.stored + op.refused < op.store_quorum) {
    // The remembered replicas are gone: find the closest nodes after all (the ones that
    // failed are not asked again).
    store_cache_.erase(op.key.id());
    op.from_cache = false;
    op.storing = false;
    start_lookup(op, op.key.id(), {}, now, cfg_.effective_store_beam(op.replicas),
                 cfg_.effective_store_alpha(op.replicas));
    return pump(id, now);
  }
  if (waiting == 0) return finish_store(id, now);
  // Enough replicas hold it: report now, the other requests complete in the background.
  if (op.stored >= op.store_quorum) report(op, success(), now);
}

void DhtCore::finish_store(std::uint64_t id, const Now& now) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  const Operation& op = it->second;
  if (op.stored > 0) return finish(id, success(), now);
  if (op.refused > 0)
    return finish(id,
                  make_error(dht_errc::stale, "store " + op.key.to_string() + ": " +
                                                  std::to_string(op.refused) +
                                                  " replicas hold a newer record"),
                  now);
  finish(id,
         make_error(errc::unavailable, "store " + op.key.to_string() + ": no node accepted it (" +
                                           std::to_string(op.lookup ? op.lookup->responded() : 0) +
                                           " nodes answered the lookup)"),
         now);
}

void DhtCore::cache_along_path(Operation& op, const Now& now) {
  if (op.found.empty() || !op.closest_without_value || cfg_.cache_ttl.count() <= 0) return;
  const Contact& to = *op.closest_without_value;
  // A cache copy is a favour, not a replica: never worth a new connection (TCP, Noise XX and
  // yamux on both ends, competing with the next operation for CPU).
  if (connected_ && !connected_(to.peer)) return;
  auto records = op.found.to_records(now.mono);
  if (records.empty()) return;
  // Nobody rewrites a cached copy (the writer's stores go to the replicas), so it lives
  // briefly: at most cache_ttl, halved for every node the lookup knows closer to the key
  // beyond the `replicas` closest (Kademlia section 2.3: the farther from the key, the shorter).
  const std::size_t rank = op.lookup ? op.lookup->rank(to.id) : 0;
  const std::size_t replicas = cfg_.effective_replicas();
  const std::size_t between = std::min<std::size_t>(rank > replicas ? rank - replicas : 0, 20);
  const Millis cap = std::chrono::duration_cast<Millis>(cfg_.cache_ttl) / (1LL << between);
  if (cap.count() <= 0) return;
  for (auto& r : records) r.ttl = std::min(r.ttl, cap);
  StoreRequest req;
  req.items.push_back(StoreItem{op.key, std::move(records)});
  send(to, std::move(req), Purpose::cache, 0, now);
}

void DhtCore::republish(const Now& now) {
  if (cfg_.republish_interval.count() <= 0) return;
  std::vector<std::pair<RecordKey, Slot>> due;
  for (auto it = own_.begin(); it != own_.end();) {
    OwnRecord& own = it->second;
    own.slot.expire(now.mono);
    if (own.slot.empty()) {
      it = own_.erase(it);
      continue;
    }
    if (own.next_republish <= now.mono) {
      own.next_republish = now.mono + cfg_.republish_interval;
      due.emplace_back(own.key, own.slot);
    }
    ++it;
  }
  // The same quorum as a caller's store (a majority of the replicas by default): a republish
  // that reaches fewer of its remembered replicas falls back to a lookup of the current
  // closest nodes, which is what republishing is for.
  const std::size_t replicas = cfg_.effective_replicas();
  for (auto& [key, slot] : due)
    start_store(key, std::move(slot), replicas, cfg_.effective_store_quorum(replicas), true, now);
}

}  // namespace starling::dht
