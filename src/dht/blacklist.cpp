#include "starling/dht/blacklist.hpp"

#include <algorithm>

namespace starling::dht {

bool Blacklist::blocked(const DhtId& id, TimePoint now) const {
  auto it = entries_.find(id);
  return it != entries_.end() && now < it->second.until;
}

TimePoint Blacklist::on_failure(const DhtId& id, TimePoint now) {
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    if (entries_.size() >= capacity_) {
      next_sweep_ = {};
      sweep(now);
      if (entries_.size() >= capacity_) {
        // Forget the peer whose ban ends first.
        auto victim = std::min_element(entries_.begin(), entries_.end(), [](auto& a, auto& b) {
          return a.second.until < b.second.until;
        });
        entries_.erase(victim);
      }
    }
    it = entries_.emplace(id, Entry{}).first;
  }
  Entry& e = it->second;
  ++e.failures;
  Duration ban = base_;
  for (std::size_t i = 1; i < e.failures && ban < max_; ++i) ban *= 2;
  e.until = now + std::min(ban, max_);
  return e.until;
}

void Blacklist::sweep(TimePoint now) {
  if (now < next_sweep_) return;
  next_sweep_ = now + max_ / 8;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.until + max_ < now)
      it = entries_.erase(it);
    else
      ++it;
  }
}

std::size_t Blacklist::failures(const DhtId& id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? 0 : it->second.failures;
}

}  // namespace starling::dht
