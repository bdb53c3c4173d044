// DhtCore: the holders of a rewritten key (DhtConfig::store_holders). Routing tables are
// partial, so two lookups of one key can end on different closest sets (joins, lost or slow
// answers); without this, each store of a key rewritten every few hundred milliseconds would
// land on whichever set its lookup found, leaving older versions (or, for a dictionary, older
// entries) on the nodes of earlier sets, where a get that meets them first stops. So the nodes
// that accepted this node's stores of a key get every later store of it as well: the replicas
// stay put instead of scattering, and what they hold stays current.
#include <algorithm>

#include "starling/dht/core.hpp"

namespace starling::dht {

DhtCore::Holders* DhtCore::holders_of(const DhtId& key, bool create) {
  if (cfg_.store_holders == 0) return nullptr;
  auto it = holders_.find(key);
  if (it != holders_.end()) {
    holders_lru_.splice(holders_lru_.end(), holders_lru_, it->second.lru);  // most recent last
    return &it->second;
  }
  if (!create) return nullptr;
  while (!holders_lru_.empty() &&
         holders_.size() >= std::max<std::size_t>(cfg_.store_holder_keys, 1)) {
    holders_.erase(holders_lru_.front());
    holders_lru_.pop_front();
  }
  it = holders_.emplace(key, Holders{}).first;
  it->second.lru = holders_lru_.insert(holders_lru_.end(), key);
  return &it->second;
}

void DhtCore::note_holder(const DhtId& key, const Contact& who, StoreAck ack) {
  if (ack == StoreAck::pending) return;
  Holders* h = holders_of(key, ack != StoreAck::failed);
  if (!h) return;
  auto& nodes = h->nodes;
  const auto known = static_cast<std::size_t>(
      std::find_if(nodes.begin(), nodes.end(), [&](const Contact& c) { return c.id == who.id; }) -
      nodes.begin());
  auto forget = [h](std::size_t i) {
    h->nodes.erase(h->nodes.begin() + static_cast<std::ptrdiff_t>(i));
    h->failures.erase(h->failures.begin() + static_cast<std::ptrdiff_t>(i));
  };
  if (ack == StoreAck::failed) {  // a lost message, or gone: the lookup finds its replacement
    if (known < nodes.size() && ++h->failures[known] >= std::max<std::size_t>(cfg_.max_failures, 1))
      forget(known);
    return;
  }
  // Held, or refused because it holds a newer record: either way it holds the key.
  if (known < nodes.size()) {
    nodes[known] = who;  // its latest addresses
    h->failures[known] = 0;
    return;
  }
  nodes.push_back(who);
  h->failures.push_back(0);
  if (nodes.size() <= cfg_.store_holders) return;
  // Keep the closest to the key: gets converge on them.
  const auto farthest = std::max_element(nodes.begin(), nodes.end(),
                                         [&](const Contact& a, const Contact& b) {
                                           return closer(key, a.id, b.id);
                                         }) -
                        nodes.begin();
  forget(static_cast<std::size_t>(farthest));
}

void DhtCore::add_holders(Operation& op, std::vector<Contact>& targets, bool& local) {
  const Holders* h = holders_of(op.key.id(), false);
  if (!h) return;
  if (h->local && !cfg_.client_mode) local = true;
  for (const auto& c : h->nodes)
    if (c.id != self_.id && std::none_of(targets.begin(), targets.end(),
                                         [&](const Contact& t) { return t.id == c.id; }))
      targets.push_back(c);
}

}  // namespace starling::dht
