#include "starling/dht/routing_table.hpp"

#include <algorithm>

namespace starling::dht {

namespace {
template <class V>
auto find_node(V& v, const DhtId& id) {
  return std::find_if(v.begin(), v.end(), [&](const RoutingNode& n) { return n.contact.id == id; });
}
}  // namespace

RoutingTable::RoutingTable(DhtId self, Options options, TimePoint now)
    : self_(self), opt_(options) {
  if (opt_.k == 0) opt_.k = 1;
  Bucket root;
  root.last_touched = now;
  buckets_.push_back(std::move(root));
}

std::size_t RoutingTable::bucket_index(const DhtId& id) const {
  // The last bucket whose prefix is <= id covers it (the ranges partition the space).
  auto it = std::upper_bound(buckets_.begin(), buckets_.end(), id,
                             [](const DhtId& v, const Bucket& b) { return v < b.prefix; });
  return static_cast<std::size_t>(std::distance(buckets_.begin(), it)) - 1;
}

bool RoutingTable::can_split(const Bucket& b) const {
  if (b.depth >= DhtId::kBits) return false;
  if (b.covers(self_)) return true;
  return opt_.split_depth_modulo > 0 && b.depth % opt_.split_depth_modulo != 0;
}

void RoutingTable::split(std::size_t index) {
  Bucket old = std::move(buckets_[index]);
  Bucket lo, hi;
  lo.depth = hi.depth = old.depth + 1;
  lo.prefix = old.prefix.with_bit(old.depth, false);
  hi.prefix = old.prefix.with_bit(old.depth, true);
  lo.last_touched = hi.last_touched = old.last_touched;
  for (auto& n : old.nodes) (n.contact.id.bit(old.depth) ? hi : lo).nodes.push_back(std::move(n));
  for (auto& n : old.replacements)
    (n.contact.id.bit(old.depth) ? hi : lo).replacements.push_back(std::move(n));
  if (old.pinging) (old.pinging->bit(old.depth) ? hi : lo).pinging = old.pinging;
  for (Bucket* b : {&lo, &hi}) {
    // A bucket that has room no longer needs an eviction; replacements fill it.
    if (b->nodes.size() < opt_.k) b->pinging.reset();
    while (b->nodes.size() < opt_.k && !b->replacements.empty()) {
      // Keep nodes ordered by last_seen: insert the promoted one where it belongs.
      RoutingNode n = std::move(b->replacements.back());
      b->replacements.pop_back();
      auto pos =
          std::upper_bound(b->nodes.begin(), b->nodes.end(), n.last_seen,
                           [](TimePoint t, const RoutingNode& x) { return t < x.last_seen; });
      b->nodes.insert(pos, std::move(n));
      ++size_;
      ++version_;
    }
  }
  ++version_;
  buckets_[index] = std::move(lo);
  buckets_.insert(buckets_.begin() + static_cast<std::ptrdiff_t>(index) + 1, std::move(hi));
}

void RoutingTable::promote_replacement(Bucket& b) {
  if (b.replacements.empty() || b.nodes.size() >= opt_.k) return;
  b.nodes.push_back(std::move(b.replacements.back()));
  b.replacements.pop_back();
  ++size_;
  ++version_;
}

bool RoutingTable::has_room(const DhtId& id) const {
  if (id == self_ || contains(id)) return false;
  const Bucket& b = buckets_[bucket_index(id)];
  // Follow the splits on_seen would make: at each depth the sub-bucket holding `id` keeps the
  // nodes that share its first depth + 1 bits.
  std::size_t count = b.nodes.size();
  for (std::size_t depth = b.depth; count >= opt_.k; ++depth) {
    const bool covers_self = self_.common_prefix_length(id) >= depth;
    const bool splits =
        depth < DhtId::kBits &&
        (covers_self || (opt_.split_depth_modulo > 0 && depth % opt_.split_depth_modulo != 0));
    if (!splits) return false;
    count = static_cast<std::size_t>(std::count_if(
        b.nodes.begin(), b.nodes.end(),
        [&](const RoutingNode& n) { return n.contact.id.common_prefix_length(id) > depth; }));
  }
  return true;
}

std::optional<RoutingTable::PingAction> RoutingTable::on_seen(const Contact& contact,
                                                              TimePoint now) {
  if (contact.id == self_) return std::nullopt;
  for (;;) {
    const std::size_t bi = bucket_index(contact.id);
    Bucket& b = buckets_[bi];
    b.last_touched = now;  // traffic with a node of this range keeps the bucket fresh
    if (auto it = find_node(b.nodes, contact.id); it != b.nodes.end()) {
      RoutingNode n = std::move(*it);
      b.nodes.erase(it);
      if (!contact.addrs.empty()) n.contact.addrs = contact.addrs;
      n.last_seen = now;
      n.failures = 0;
      b.nodes.push_back(std::move(n));
      return std::nullopt;
    }
    if (b.nodes.size() < opt_.k) {
      if (auto it = find_node(b.replacements, contact.id); it != b.replacements.end())
        b.replacements.erase(it);
      b.nodes.push_back(RoutingNode{contact, now, 0});
      ++size_;
      ++version_;
      return std::nullopt;
    }
    if (can_split(b)) {
      split(bi);
      continue;
    }
    // Full: remember the newcomer as a replacement and check the least-recently-seen node.
    if (auto it = find_node(b.replacements, contact.id); it != b.replacements.end())
      b.replacements.erase(it);
    b.replacements.push_back(RoutingNode{contact, now, 0});
    if (b.replacements.size() > opt_.replacements)
      b.replacements.erase(b.replacements.begin(),
                           b.replacements.begin() + static_cast<std::ptrdiff_t>(
                                                        b.replacements.size() - opt_.replacements));
    if (b.pinging || b.replacements.empty()) return std::nullopt;
    b.pinging = b.nodes.front().contact.id;
    return PingAction{b.nodes.front().contact};
  }
}

void RoutingTable::on_ping_result(const DhtId& id, bool alive, TimePoint now) {
  Bucket& b = buckets_[bucket_index(id)];
  if (b.pinging == id) b.pinging.reset();
  auto it = find_node(b.nodes, id);
  if (it == b.nodes.end()) return;
  if (alive) {
    RoutingNode n = std::move(*it);
    b.nodes.erase(it);
    n.last_seen = now;
    n.failures = 0;
    b.nodes.push_back(std::move(n));
    return;
  }
  b.nodes.erase(it);
  --size_;
  ++version_;
  promote_replacement(b);
}

bool RoutingTable::on_failure(const DhtId& id) {
  Bucket& b = buckets_[bucket_index(id)];
  if (auto r = find_node(b.replacements, id); r != b.replacements.end()) {
    b.replacements.erase(r);
    return false;
  }
  auto it = find_node(b.nodes, id);
  if (it == b.nodes.end()) return false;
  ++it->failures;
  if (b.replacements.empty() && it->failures < opt_.max_failures) return false;
  if (b.pinging == id) b.pinging.reset();
  b.nodes.erase(it);
  --size_;
  ++version_;
  promote_replacement(b);
  return true;
}

void RoutingTable::remove(const DhtId& id) {
  Bucket& b = buckets_[bucket_index(id)];
  if (auto r = find_node(b.replacements, id); r != b.replacements.end()) b.replacements.erase(r);
  auto it = find_node(b.nodes, id);
  if (it == b.nodes.end()) return;
  if (b.pinging == id) b.pinging.reset();
  b.nodes.erase(it);
  --size_;
  ++version_;
  promote_replacement(b);
}

const RoutingNode* RoutingTable::find(const DhtId& id) const {
  const Bucket& b = buckets_[bucket_index(id)];
  auto it = find_node(b.nodes, id);
  return it == b.nodes.end() ? nullptr : &*it;
}

std::vector<Contact> RoutingTable::closest(const DhtId& target, std::size_t count,
                                           const std::optional<DhtId>& exclude) const {
  // Bucket ranges are disjoint prefixes, so all members of one bucket are closer to the
  // target than all members of another, in the order of (prefix ^ target) masked to the
  // bucket's depth. Visit buckets in that order and sort only the ones taken.
  std::vector<std::pair<DhtId, const Bucket*>> order;
  order.reserve(buckets_.size());
  for (const auto& b : buckets_)
    if (!b.nodes.empty()) order.emplace_back((b.prefix ^ target).masked(b.depth), &b);
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Contact> out;
  out.reserve(std::min(count, size_));
  std::vector<std::pair<DhtId, const Contact*>> members;
  for (const auto& [bound, b] : order) {
    if (out.size() >= count) break;
    members.clear();
    for (const auto& n : b->nodes)
      if (!exclude || n.contact.id != *exclude)
        members.emplace_back(n.contact.id ^ target, &n.contact);
    std::sort(members.begin(), members.end(),
              [](const auto& x, const auto& y) { return x.first < y.first; });
    for (const auto& [d, c] : members) {
      if (out.size() >= count) break;
      out.push_back(*c);
    }
  }
  return out;
}

void RoutingTable::touch(const DhtId& target, TimePoint now) {
  buckets_[bucket_index(target)].last_touched = now;
}

std::vector<DhtId> RoutingTable::refresh_targets(TimePoint now, Duration interval,
                                                 std::mt19937_64& rng) {
  std::vector<DhtId> out;
  for (auto& b : buckets_)
    if (now - b.last_touched >= interval) {
      b.last_touched = now;
      out.push_back(DhtId::random_with_prefix(b.prefix, b.depth, rng));
    }
  return out;
}

std::vector<DhtId> RoutingTable::all_bucket_targets(std::mt19937_64& rng) const {
  std::vector<DhtId> out;
  for (const auto& b : buckets_) out.push_back(DhtId::random_with_prefix(b.prefix, b.depth, rng));
  return out;
}

}  // namespace starling::dht
