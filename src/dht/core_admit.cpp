// DhtCore: admission of lookup-learned nodes into the routing table (DhtConfig::admit_learned).
// A node named in a lookup answer is only a candidate; a ping it answers proves it alive (and
// its answer's header says whether it is a client), then note_alive() puts it into the table
// under the usual k-bucket rules. Only nodes whose bucket has room are pinged, so a full
// bucket's old live nodes are never displaced by strangers (its replacement cache and
// ping-evict rule still apply to nodes that contact us). The pings wait while a caller's
// operation runs: their dials (TCP, Noise, yamux) would run on this node's thread ahead of
// that operation's answers (measured: get p50 2.1 -> 5.3 ms at 128 nodes when they did not).
#include "starling/dht/core.hpp"

namespace starling::dht {

void DhtCore::consider_admission(const std::vector<Contact>& learned, const Now& now) {
  if (!cfg_.admit_learned) return;
  for (const auto& c : learned) {
    if (admit_queue_.size() >= cfg_.admit_queue) break;
    if (c.addrs.empty() || admitting_.count(c.id) || !routing_.has_room(c.id) ||
        blacklist_.blocked(c.id, now.mono))
      continue;
    admitting_.insert(c.id);
    admit_queue_.push_back(c);
  }
  pump_admissions(now);
}

// A caller's operation in progress (not yet reported): admission pings wait for it to end,
// since their dials (TCP, Noise, yamux) run on this node's thread ahead of its answers.
bool DhtCore::foreground_busy() const {
  for (const auto& [id, op] : ops_)
    if (!op.internal && !op.reported) return true;
  return false;
}

void DhtCore::pump_admissions(const Now& now) {
  if (admit_queue_.empty() || !admit_open_ || foreground_busy()) return;
  while (admit_in_flight_ < std::max<std::size_t>(cfg_.admit_parallel, 1) &&
         !admit_queue_.empty()) {
    Contact c = std::move(admit_queue_.front());
    admit_queue_.pop_front();
    // Things change while it waited: another message may have admitted it, or filled its
    // bucket, or it failed a request.
    if (!routing_.has_room(c.id) || blacklist_.blocked(c.id, now.mono)) {
      admitting_.erase(c.id);
      continue;
    }
    ++admit_in_flight_;
    ++admit_sent_;
    send(c, PingRequest{}, Purpose::admit, 0, now);
  }
}

void DhtCore::on_admit_done(const DhtId& id, const Now& now) {
  admitting_.erase(id);
  if (admit_in_flight_ > 0) --admit_in_flight_;
  pump_admissions(now);
}

void DhtCore::set_admission_open(bool open, const Now& now) {
  admit_open_ = open;
  pump_admissions(now);
}

}  // namespace starling::dht
