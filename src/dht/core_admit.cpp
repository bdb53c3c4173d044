// DhtCore: admission of lookup-learned nodes into the routing table (DhtConfig::admit_learned).
// A node named in a lookup answer is only a candidate; a ping it answers proves it alive (and
// its answer's header says whether it is a client), then note_alive() puts it into the table
// under the usual k-bucket rules. Only nodes whose bucket has room are pinged, so a full
// bucket's old live nodes are never displaced by strangers (its replacement cache and
// ping-evict rule still apply to nodes that contact us).
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

void DhtCore::pump_admissions(const Now& now) {
  while (admit_open_ && admit_in_flight_ < std::max<std::size_t>(cfg_.admit_parallel, 1) &&
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
