// DhtCore: timers (request deadlines, slow requests, operation deadlines) and housekeeping
// (expiry, blacklist, bucket refresh, republishing).
#include "starling/dht/core.hpp"

namespace starling::dht {

void DhtCore::tick(const Now& now) {
  while (!timers_.empty() && timers_.begin()->at <= now.mono) {
    const Timer t = *timers_.begin();
    timers_.erase(timers_.begin());
    switch (t.kind) {
      case TimerKind::request_deadline:
        fail_request(t.id, make_error(errc::timeout, "dht request"), now);
        break;
      case TimerKind::request_slow: {
        auto p = pending_.find(t.id);
        if (p == pending_.end()) break;
        auto op = ops_.find(p->second.op);
        if (op == ops_.end() || !op->second.lookup || op->second.storing) break;
        op->second.lookup->on_slow(p->second.to.id);
        pump(p->second.op, now);
        break;
      }
      case TimerKind::op_deadline: {
        auto op = ops_.find(t.id);
        if (op == ops_.end()) break;
        const Operation& o = op->second;
        // Out of time: report what was achieved, if anything.
        if ((o.kind == OpKind::get && !o.found.empty()) || (o.kind == OpKind::store && o.stored))
          finish(t.id, success(), now);
        else
          finish(t.id, make_error(errc::timeout, "dht operation"), now);
        break;
      }
    }
  }
  if (now.mono >= next_maintenance_) {
    next_maintenance_ = now.mono + cfg_.maintenance_interval;
    maintenance(now);
  }
}

TimePoint DhtCore::next_wakeup() const {
  if (!timers_.empty() && timers_.begin()->at < next_maintenance_) return timers_.begin()->at;
  return next_maintenance_;
}

void DhtCore::maintenance(const Now& now) {
  store_.expire(now.mono);
  blacklist_.sweep(now.mono);
  expire_replicated(now);
  std::erase_if(store_cache_, [&](const auto& e) { return e.second.until <= now.mono; });
  if (routing_.size() > 0)
    for (const auto& t : routing_.refresh_targets(now.mono, cfg_.refresh_interval, rng_))
      start_find(t, true, now);
  republish(now);
}

}  // namespace starling::dht
