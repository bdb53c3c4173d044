// Blacklist of unresponsive peers with exponential backoff: after the n-th failure in a row
// a peer is not contacted for base * 2^(n-1) (capped at `max`); an answer clears it. Entries
// whose ban ended more than `max` ago are forgotten; the list holds at most `capacity` peers.
//
// Threading rule: owned by one DhtCore; used from its thread only.
#pragma once

#include <unordered_map>

#include "starling/dht/id.hpp"

namespace starling::dht {

class Blacklist {
 public:
  Blacklist(Duration base, Duration max, std::size_t capacity)
      : base_(base), max_(max), capacity_(capacity ? capacity : 1) {}

  bool blocked(const DhtId& id, TimePoint now) const;
  // Records a failure; returns the end of the new ban.
  TimePoint on_failure(const DhtId& id, TimePoint now);
  void on_success(const DhtId& id) { entries_.erase(id); }
  // Forgets entries whose ban ended more than `max` ago (at most every `max` / 8).
  void sweep(TimePoint now);
  std::size_t size() const noexcept { return entries_.size(); }
  std::size_t failures(const DhtId& id) const;

 private:
  struct Entry {
    std::size_t failures = 0;
    TimePoint until;
  };
  Duration base_, max_;
  std::size_t capacity_;
  TimePoint next_sweep_{};
  std::unordered_map<DhtId, Entry> entries_;
};

}  // namespace starling::dht
