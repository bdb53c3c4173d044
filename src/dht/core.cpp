// DhtCore: construction, request bookkeeping, responses and failures, operation results.
#include "starling/dht/core.hpp"

#include <algorithm>

#include "dht_log.hpp"

namespace starling::dht {

DhtCore::DhtCore(DhtConfig config, net::PeerId self, ValidatorChain validators, std::uint64_t seed,
                 TimePoint now)
    : cfg_(std::move(config)),
      self_(Contact::of(std::move(self))),
      validators_(std::move(validators)),
      rng_(seed),
      routing_(self_.id,
               RoutingTable::Options{cfg_.k, cfg_.split_depth_modulo, cfg_.effective_replacements(),
                                     cfg_.max_failures},
               now),
      store_(
          RecordStore::Limits{cfg_.max_stored_keys, cfg_.max_subkeys_per_key, cfg_.max_stored_bytes,
                              std::min(cfg_.max_bytes_per_key, cfg_.limits.max_message_bytes / 2),
                              cfg_.max_bytes_per_source, cfg_.max_records_per_source}),
      blacklist_(cfg_.blacklist_base, cfg_.blacklist_max, cfg_.blacklist_capacity),
      next_maintenance_(now + cfg_.maintenance_interval) {
  if (cfg_.k == 0) cfg_.k = 1;
  if (cfg_.alpha == 0) cfg_.alpha = 1;
}

NodeHeader DhtCore::header() const {
  NodeHeader h;
  h.client_mode = cfg_.client_mode;
  if (!cfg_.client_mode) h.addrs = self_.addrs;
  return h;
}

ValidationContext DhtCore::validation_context(const Now& now) const {
  return ValidationContext{now.wall, cfg_.max_clock_skew};
}

DhtCore::Operation& DhtCore::new_op(OpKind kind, bool internal, const Now& now) {
  const std::uint64_t id = next_id_++;
  Operation& op = ops_[id];
  op.id = id;
  op.kind = kind;
  op.internal = internal;
  op.deadline = now.mono + cfg_.operation_timeout;
  timers_.insert(Timer{op.deadline, TimerKind::op_deadline, id});
  return op;
}

RequestId DhtCore::send(const Contact& to, decltype(Request::body) body, Purpose purpose,
                        std::uint64_t op, const Now& now) {
  const std::uint64_t rid = next_id_++;
  Pending p{to, op, purpose, now.mono + cfg_.request_timeout, now.mono + slow_after(), now.mono};
  timers_.insert(Timer{p.deadline, TimerKind::request_deadline, rid});
  if (purpose == Purpose::lookup) timers_.insert(Timer{p.slow_at, TimerKind::request_slow, rid});
  outbox_.push_back(
      OutgoingRequest{RequestId{rid}, to, Request{header(), std::move(body)}, p.deadline});
  pending_.emplace(rid, std::move(p));
  return RequestId{rid};
}

std::optional<OutgoingRequest> DhtCore::poll_request() {
  if (outbox_.empty()) return std::nullopt;
  OutgoingRequest r = std::move(outbox_.front());
  outbox_.pop_front();
  return r;
}

std::optional<OpResult> DhtCore::poll_result() {
  if (results_.empty()) return std::nullopt;
  OpResult r = std::move(results_.front());
  results_.pop_front();
  return r;
}

void DhtCore::note_alive(const Contact& who, const NodeHeader& h, const Now& now) {
  blacklist_.on_success(who.id);
  if (h.client_mode) {
    routing_.remove(who.id);
    return;
  }
  const bool known = routing_.contains(who.id);
  Contact c{who.peer, who.id, h.addrs.empty() ? who.addrs : h.addrs};
  ping_for_eviction(routing_.on_seen(c, now.mono), now);
  if (!known && routing_.contains(who.id)) {
    replicate_to(c, now);  // a newcomer
    check_growth(now);
  }
}

void DhtCore::note_failure(const Contact& who, const Now& now) {
  blacklist_.on_failure(who.id, now.mono);
  routing_.on_failure(who.id);
}

void DhtCore::ping_for_eviction(const std::optional<RoutingTable::PingAction>& action,
                                const Now& now) {
  if (action) send(action->node, PingRequest{}, Purpose::ping, 0, now);
}

void DhtCore::note_rtt(Duration sample) {
  if (sample.count() < 0) return;
  if (!rtt_known_) {
    srtt_ = sample;
    rttvar_ = sample / 2;
    rtt_known_ = true;
    return;
  }
  const Duration dev = sample > srtt_ ? sample - srtt_ : srtt_ - sample;
  rttvar_ = (3 * rttvar_ + dev) / 4;
  srtt_ = (7 * srtt_ + sample) / 8;
}

Duration DhtCore::slow_after() const {
  if (!rtt_known_) return cfg_.slow_request;
  return std::clamp<Duration>(
      srtt_ + 4 * rttvar_, std::min(cfg_.slow_request_min, cfg_.slow_request), cfg_.slow_request);
}

void DhtCore::on_failure(RequestId id, const Error& error, const Now& now) {
  fail_request(static_cast<std::uint64_t>(id), error, now);
}

void DhtCore::fail_request(std::uint64_t rid, const Error& error, const Now& now) {
  auto it = pending_.find(rid);
  if (it == pending_.end()) return;
  Pending p = std::move(it->second);
  pending_.erase(it);
  timers_.erase(Timer{p.deadline, TimerKind::request_deadline, rid});
  timers_.erase(Timer{p.slow_at, TimerKind::request_slow, rid});
  if (dht_log().should_log(spdlog::level::debug))
    dht_log().debug("request to {} failed: {}", p.to.peer.short_string(), error.message());
  note_failure(p.to, now);
  switch (p.purpose) {
    case Purpose::lookup: {
      auto op = ops_.find(p.op);
      if (op == ops_.end() || !op->second.lookup || op->second.storing) return;
      ++op->second.stats.failures;
      op->second.lookup->on_failure(p.to.id);
      pump(p.op, now);
      return;
    }
    case Purpose::store:
      on_store_answer(p.op, p.to, StoreAck::failed, now);
      return;
    case Purpose::ping:
      routing_.on_ping_result(p.to.id, false, now.mono);
      return;
    case Purpose::cache:
    case Purpose::replicate:
      return;
    case Purpose::admit:
      on_admit_done(p.to.id, now);
      return;
  }
}

void DhtCore::on_response(RequestId id, const Response& resp, const Now& now) {
  const auto rid = static_cast<std::uint64_t>(id);
  auto it = pending_.find(rid);
  if (it == pending_.end()) return;  // late: already failed or timed out
  const Pending& p = it->second;
  bool fits = false;
  switch (p.purpose) {
    case Purpose::lookup: {
      auto* f = std::get_if<FindResponse>(&resp.body);
      fits = f && f->results.size() == 1;
      break;
    }
    case Purpose::store:
    case Purpose::cache:
    case Purpose::replicate:
      fits = std::holds_alternative<StoreResponse>(resp.body);
      break;
    case Purpose::ping:
    case Purpose::admit:
      fits = std::holds_alternative<PingResponse>(resp.body);
      break;
  }
  if (!fits) {
    dht_log().warn("peer {} answered a request with a mismatched {} response",
                   p.to.peer.short_string(), describe(resp));
    fail_request(rid, make_error(errc::protocol_violation, "mismatched response"), now);
    return;
  }
  Pending done = std::move(it->second);
  pending_.erase(it);
  timers_.erase(Timer{done.deadline, TimerKind::request_deadline, rid});
  timers_.erase(Timer{done.slow_at, TimerKind::request_slow, rid});
  note_alive(done.to, resp.sender, now);
  note_rtt(now.mono - done.sent);
  switch (done.purpose) {
    case Purpose::lookup: {
      auto op = ops_.find(done.op);
      if (op == ops_.end() || !op->second.lookup || op->second.storing) return;
      ++op->second.stats.responses;
      on_find_response(op->second, done.to, std::get<FindResponse>(resp.body).results.front(), now);
      pump(done.op, now);
      return;
    }
    case Purpose::store:
      on_store_answer(done.op, done.to, store_ack_of(std::get<StoreResponse>(resp.body)), now);
      return;
    case Purpose::ping:
      routing_.on_ping_result(done.to.id, true, now.mono);
      return;
    case Purpose::cache:
    case Purpose::replicate:
      return;
    case Purpose::admit:
      on_admit_done(done.to.id, now);
      return;
  }
}

void DhtCore::finish(std::uint64_t id, result<void> status, const Now& now) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  Operation op = std::move(it->second);
  ops_.erase(it);
  timers_.erase(Timer{op.deadline, TimerKind::op_deadline, id});
  if (op.kind == OpKind::get) {
    auto g = active_gets_.find(op.key.id());
    if (g != active_gets_.end() && g->second == id) active_gets_.erase(g);
    if (status) cache_along_path(op, now);
  }
  report(op, std::move(status), now);
  if (op.round) {
    --refresh_in_flight_;
    continue_refresh_round(now);
  }
}

void DhtCore::report(Operation& op, result<void> status, const Now& now) {
  if (op.internal || op.reported) return;
  op.reported = true;
  OpResult r;
  r.id = OpId{op.id};
  r.kind = op.kind;
  r.status = std::move(status);
  r.stats = op.stats;
  switch (op.kind) {
    case OpKind::get:
      r.value = std::move(op.found);
      r.value.expire(now.mono);
      break;
    case OpKind::store:
      r.stored = op.stored;
      r.refused = op.refused;
      if (op.lookup) r.closest = op.lookup->closest_responded(op.replicas);
      break;
    case OpKind::bootstrap:
    case OpKind::find_node:
      if (op.lookup) r.closest = op.lookup->closest_responded(cfg_.k);
      break;
  }
  for (auto j : op.joined) {
    OpResult copy = r;
    copy.id = OpId{j};
    results_.push_back(std::move(copy));
  }
  results_.push_back(std::move(r));
  pump_admissions(now);  // they waited for the caller's operations to end
}

}  // namespace starling::dht
