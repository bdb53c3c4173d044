// DhtNode: warm connections to routing-table neighbours (see DhtNodeConfig::warm_connections).
#include <algorithm>

#include "dht_log.hpp"
#include "starling/dht/node.hpp"

namespace starling::dht {

std::vector<Contact> DhtNode::warm_candidates() const {
  // Far buckets first (shortest common prefix with our id: each of their nodes is the closest
  // we know for the most keys); inside a bucket the most recently seen first.
  std::vector<const Bucket*> buckets;
  for (const auto& b : core_.routing().buckets()) buckets.push_back(&b);
  std::stable_sort(buckets.begin(), buckets.end(),
                   [](const Bucket* a, const Bucket* b) { return a->depth < b->depth; });
  std::vector<Contact> out;
  for (const Bucket* b : buckets)
    for (auto it = b->nodes.rbegin(); it != b->nodes.rend(); ++it) {
      if (out.size() >= cfg_.warm_connections) return out;
      out.push_back(it->contact);
    }
  return out;
}

// Admission pings dial strangers: only while the host holds fewer connections than the warm
// bound allows (the same bound on file descriptors as warm dials).
void DhtNode::update_admission() {
  const bool open =
      cfg_.warm_connections == 0 || host_->connection_count() < 2 * cfg_.warm_connections;
  core_.set_admission_open(open, now());
}

// The warm set is recomputed only when something it depends on changed: the routing table's
// membership (its version), a disconnect, the end of a warm dial, or a failed peer's retry
// time. Idle nodes then cost one integer comparison per warm_interval instead of a walk over
// every warm peer (256 idle nodes used 0.34-0.5 cores when the set was walked every interval).
bool DhtNode::warm_due() const {
  return warm_dirty_ || warm_version_ != core_.routing().version() ||
         warm_next_retry_ <= Clock::now();
}

void DhtNode::refresh_warm() {
  if (stopping_) return;
  if (cfg_.dht.admit_learned) {
    update_admission();
    pump();
  }
  if (cfg_.warm_connections == 0) return;
  ++warm_recomputes_;
  warm_dirty_ = false;
  warm_version_ = core_.routing().version();
  warm_next_retry_ = TimePoint::max();
  const auto wanted = warm_candidates();
  std::set<net::PeerId> now_kept;
  for (const auto& c : wanted) now_kept.insert(c.peer);
  for (const auto& p : warm_kept_)
    if (!now_kept.count(p)) {
      host_->keep_alive(p, false);
      warm_retry_at_.erase(p);
    }
  const TimePoint t = Clock::now();
  for (const auto& c : wanted) {
    host_->keep_alive(c.peer, true);
    if (warm_dialing_.size() >= std::max<std::size_t>(cfg_.warm_parallel, 1)) continue;
    if (warm_dialing_.count(c.peer) || host_->is_connected(c.peer)) continue;
    // Inbound connections count too: this bounds the node's file descriptors.
    if (host_->connection_count() + warm_dialing_.size() >= 2 * cfg_.warm_connections) continue;
    if (auto it = warm_retry_at_.find(c.peer); it != warm_retry_at_.end() && it->second > t) {
      warm_next_retry_ = std::min(warm_next_retry_, it->second);
      continue;
    }
    warm_dialing_.insert(c.peer);
    auto self = shared_from_this();
    scope_.spawn([self, c]() { return self->warm_dial(c); });
  }
  warm_kept_ = std::move(now_kept);
}

awaitable<void> DhtNode::warm_dial(Contact c) {
  std::vector<net::Multiaddr> addrs;
  for (const auto& b : c.addrs)
    if (auto a = net::Multiaddr::from_bytes(b)) addrs.push_back(std::move(a).value());
  if (!addrs.empty()) host_->add_addresses(c.peer, addrs);
  ++warm_dials_;
  auto r = co_await host_->connect(c.peer, cfg_.dial_timeout);
  warm_dialing_.erase(c.peer);
  if (stopping_) co_return;
  if (!r) {
    ++warm_failed_;
    warm_retry_at_[c.peer] = Clock::now() + cfg_.warm_retry;
    dht_log().debug("dht: warm connection to {} failed: {}", c.peer.short_string(),
                    r.error().message());
  }
  refresh_warm();  // the next one at once, not at the next interval
}

// The loop holds the node (like the timer loop's task) until stop().
awaitable<void> DhtNode::warm_loop(std::shared_ptr<DhtNode> self) {
  self->host_->on_peer_disconnected([weak = std::weak_ptr<DhtNode>(self)](const net::PeerId&) {
    if (auto n = weak.lock()) n->warm_dirty_ = true;
  });
  while (!self->stopping_) {
    ++self->warm_checks_;
    if (self->warm_due()) {
      self->refresh_warm();
    } else if (self->cfg_.dht.admit_learned) {
      self->update_admission();
      self->pump();
    }
    auto slept = co_await sleep_for(self->cfg_.warm_interval);
    if (!slept) break;
  }
}

WarmStats DhtNode::warm_stats() const {
  WarmStats s;
  s.wanted = warm_kept_.size();
  for (const auto& p : warm_kept_)
    if (host_->is_connected(p)) ++s.connected;
  s.dialing = warm_dialing_.size();
  s.dials = warm_dials_;
  s.recomputes = warm_recomputes_;
  s.checks = warm_checks_;
  s.failed = warm_failed_;
  s.admitting = core_.admissions_waiting();
  s.refreshing = core_.refreshing();
  s.table = core_.routing().size();
  s.connections = host_->connection_count();
  return s;
}

}  // namespace starling::dht
