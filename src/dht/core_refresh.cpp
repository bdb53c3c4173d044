// DhtCore: refresh rounds (DhtConfig::refresh_splits, refresh_growth). A round is a set of
// bucket refreshes (a lookup of a random id inside a bucket): the first after joining covers
// every bucket that does not hold our own id; while its answers split buckets, the new ones
// that hold none of the round's targets are refreshed too, once each, until every bucket holds
// a target. A table that doubled since its last round (the network grew after this node
// joined) starts another. Bounds: a round starts at most one lookup per bucket (a table has at
// most 2^split_depth_modulo buckets per level of depth, each refreshed once per round); later
// rounds need the table to double each time; beyond the join's first batch nothing starts
// while the networked node says no new connections (may_dial_).
#include <algorithm>

#include "starling/dht/core.hpp"

namespace starling::dht {

void DhtCore::begin_refresh_round(const Now& now, bool first) {
  if (!first && may_dial_ && !may_dial_()) return;  // checked again at the next new table entry
  refresh_round_ = true;
  refresh_targets_.clear();
  ++refresh_rounds_;
  std::vector<DhtId> targets;
  for (const auto& b : routing_.buckets())
    if (!b.covers(self_.id)) targets.push_back(DhtId::random_with_prefix(b.prefix, b.depth, rng_));
  if (targets.empty()) return end_refresh_round();
  refresh_targets_ = targets;
  start_round_lookups(targets, now);
}

// Counted before any starts: a lookup may end at once (no candidates), and the round must not
// look finished while the others are still to start.
void DhtCore::start_round_lookups(const std::vector<DhtId>& targets, const Now& now) {
  refresh_lookups_ += targets.size();
  refresh_in_flight_ += targets.size();
  for (const auto& t : targets) start_find(t, true, now, true);
}

void DhtCore::continue_refresh_round(const Now& now) {
  if (!refresh_round_ || refresh_in_flight_ > 0) return;
  if (!cfg_.refresh_splits || (may_dial_ && !may_dial_())) return end_refresh_round();
  std::vector<DhtId> targets;
  for (const auto& b : routing_.buckets()) {
    if (b.covers(self_.id)) continue;
    const bool has = std::any_of(refresh_targets_.begin(), refresh_targets_.end(),
                                 [&](const DhtId& t) { return b.covers(t); });
    if (!has) targets.push_back(DhtId::random_with_prefix(b.prefix, b.depth, rng_));
  }
  if (targets.empty()) return end_refresh_round();
  refresh_targets_.insert(refresh_targets_.end(), targets.begin(), targets.end());
  start_round_lookups(targets, now);
}

void DhtCore::end_refresh_round() {
  refresh_round_ = false;
  refresh_targets_.clear();
  refresh_size_ = std::max<std::size_t>(routing_.size(), 1);
}

void DhtCore::check_growth(const Now& now) {
  if (cfg_.refresh_growth <= 0 || refresh_round_ || refresh_size_ == 0) return;
  if (static_cast<double>(routing_.size()) <
      cfg_.refresh_growth * static_cast<double>(refresh_size_))
    return;
  begin_refresh_round(now, false);
}

}  // namespace starling::dht
