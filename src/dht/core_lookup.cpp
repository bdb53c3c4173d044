// DhtCore: iterative lookups (bootstrap, find_node, get) and what their answers mean.
#include "dht_log.hpp"
#include "starling/dht/core.hpp"

namespace starling::dht {

void DhtCore::start_lookup(Operation& op, const DhtId& target, const std::vector<Contact>& seeds,
                           const Now& now, std::size_t beam, std::size_t alpha) {
  if (beam == 0) beam = cfg_.effective_beam();
  op.lookup.emplace(target, alpha ? alpha : cfg_.alpha, beam, 8 * std::max(beam, cfg_.k));
  for (const auto& s : seeds)
    if (s.id != self_.id) op.lookup->add(s, 1);
  // At least k candidates from the table even for a narrower beam: when the closest ones are
  // dead (failed or slow), the window moves on to the next instead of running dry.
  for (auto& c : routing_.closest(target, std::max(beam, cfg_.k))) op.lookup->add(std::move(c), 1);
  routing_.touch(target, now.mono);
}

std::vector<Contact> DhtCore::contacts_of(const std::vector<PeerInfo>& peers) const {
  std::vector<Contact> out;
  out.reserve(peers.size());
  for (const auto& p : peers) {
    if (p.peer == self_.peer) continue;
    out.push_back(Contact{p.peer, DhtId::of_peer(p.peer), p.addrs});
  }
  return out;
}

void DhtCore::pump(std::uint64_t id, const Now& now) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  Operation& op = it->second;
  if (!op.lookup || op.storing) return;
  Lookup::Connected connected;
  // A plain get needs one holder; a latest get (like a store) must reach all the closest.
  if (op.kind == OpKind::get && !op.latest && connected_ && cfg_.get_dials > 0)
    connected = [this](const Contact& c) { return connected_(c.peer); };
  for (;;) {
    auto next = op.lookup->next(connected, cfg_.get_dials);
    if (next.empty()) break;
    for (const auto& c : next) {
      // Seeds given to bootstrap are tried even if they failed recently.
      if (op.kind != OpKind::bootstrap && blacklist_.blocked(c.id, now.mono)) {
        op.lookup->on_failure(c.id);
        continue;
      }
      ++op.stats.requests;
      FindRequest req{{op.lookup->target()}, op.kind == OpKind::get};
      // A get that is not `latest` ends at its first plain value: a node answering with
      // one need not list peers beside it (a dictionary still needs a quorum of answers).
      req.value_suffices = op.kind == OpKind::get && !op.latest;
      send(c, std::move(req), Purpose::lookup, id, now);
    }
  }
  if (op.lookup->converged() || op.lookup->idle()) lookup_done(op, now);
}

void DhtCore::on_find_response(Operation& op, const Contact& from, const FindResult& res,
                               const Now& now) {
  const Lookup::Candidate* cand = op.lookup->find(from.id);
  const std::size_t hop = cand ? cand->hop : 1;
  auto learned = contacts_of(res.peers);
  consider_admission(learned, now);
  op.lookup->on_response(from.id, std::move(learned));
  if (op.kind == OpKind::store) return store_early(op, from, now);
  if (op.kind != OpKind::get) return;
  bool had_value = false;
  const auto ctx = validation_context(now);
  for (Record rec : res.records) {
    auto ok = validators_.validate(op.key, rec, ctx);
    if (!ok) {
      dht_log().warn("peer {} returned an invalid record for key {}: {}", from.peer.short_string(),
                     op.key.to_string(), ok.error().message());
      continue;
    }
    if (rec.ttl > cfg_.max_ttl) rec.ttl = cfg_.max_ttl;
    op.found.merge(rec.subkey, rec.body, now.mono + rec.ttl);
    had_value = true;
  }
  if (had_value) {
    if (op.found_hop == 0 || hop < op.found_hop) op.found_hop = hop;
    op.stats.hops = op.found_hop;
    ++op.value_answers;
    if (!op.latest && (!op.found.is_dictionary() || op.value_answers >= op.quorum))
      finish(op.id, success(), now);  // `op` is gone after this
    return;
  }
  if (!op.closest_without_value || closer(op.key.id(), from.id, op.closest_without_value->id))
    op.closest_without_value = from;
}

void DhtCore::lookup_done(Operation& op, const Now& now) {
  const Lookup& l = *op.lookup;
  if (op.kind != OpKind::get) {
    auto best = l.closest_responded(1);
    if (!best.empty()) op.stats.hops = l.find(best.front().id)->hop;
  }
  const std::uint64_t id = op.id;
  switch (op.kind) {
    case OpKind::store:
      start_store_phase(op, now);
      return;
    case OpKind::get:
      if (!op.found.empty()) return finish(id, success(), now);
      if (l.responded() == 0)
        return finish(id,
                      make_error(errc::unavailable,
                                 "get " + op.key.to_string() + ": " +
                                     (l.queried() ? "none of " + std::to_string(l.queried()) +
                                                        " queried nodes answered"
                                                  : std::string("no known peers"))),
                      now);
      return finish(
          id,
          make_error(errc::not_found, "get " + op.key.to_string() + ": none of " +
                                          std::to_string(l.responded()) + " nodes holds it"),
          now);
    case OpKind::find_node:
      if (l.responded() == 0)
        return finish(
            id,
            make_error(errc::unavailable, l.queried() ? "none of " + std::to_string(l.queried()) +
                                                            " queried nodes answered"
                                                      : std::string("no known peers")),
            now);
      return finish(id, success(), now);
    case OpKind::bootstrap: {
      if (l.responded() == 0)
        return finish(
            id,
            make_error(errc::unavailable, "bootstrap: none of the " + std::to_string(op.seeds) +
                                              " initial peers answered"),
            now);
      finish(id, success(), now);
      // Fill the far buckets too: one lookup of a random id inside each bucket (and, with
      // refresh_splits, inside each bucket their answers split off: core_refresh.cpp).
      begin_refresh_round(now, true);
      return;
    }
  }
}

std::uint64_t DhtCore::start_find(const DhtId& target, bool internal, const Now& now, bool round) {
  Operation& op = new_op(OpKind::find_node, internal, now);
  const std::uint64_t id = op.id;
  op.round = round;
  start_lookup(op, target, {}, now);
  pump(id, now);
  return id;
}

OpId DhtCore::find_node(const DhtId& target, const Now& now) {
  return OpId{start_find(target, false, now)};
}

OpId DhtCore::bootstrap(std::vector<Contact> seeds, const Now& now) {
  Operation& op = new_op(OpKind::bootstrap, false, now);
  const std::uint64_t id = op.id;
  op.seeds = seeds.size();
  if (seeds.empty() && routing_.size() == 0) {
    finish(id, make_error(errc::unavailable, "bootstrap: no initial peers given"), now);
    return OpId{id};
  }
  start_lookup(op, self_.id, seeds, now);
  pump(id, now);
  return OpId{id};
}

OpId DhtCore::get(const RecordKey& key, GetOptions options, const Now& now) {
  if (auto g = active_gets_.find(key.id()); g != active_gets_.end()) {
    auto primary = ops_.find(g->second);
    const bool covers = primary != ops_.end() &&
                        (primary->second.latest ||
                         (!options.latest && primary->second.quorum >= options.dictionary_quorum));
    if (covers) {
      const std::uint64_t id = next_id_++;
      primary->second.joined.push_back(id);
      return OpId{id};
    }
  }
  Operation& op = new_op(OpKind::get, false, now);
  const std::uint64_t id = op.id;
  op.key = key;
  op.latest = options.latest;
  op.quorum = std::max<std::size_t>(options.dictionary_quorum, 1);
  // This node's own copy counts as one answer but never ends a get alone: it may be stale (a
  // cached copy, or a replica that missed a rewrite), so the get still asks the network and
  // ends at the first remote value, merged with it (newest wins); a lookup that finds no other
  // holder returns the local copy.
  if (!cfg_.client_mode)
    if (const Slot* local = store_.find(key.id(), now.mono)) {
      op.found.merge_all(*local);
      op.value_answers = 1;
    }
  active_gets_[key.id()] = id;
  start_lookup(op, key.id(), {}, now);
  pump(id, now);
  return OpId{id};
}

}  // namespace starling::dht
