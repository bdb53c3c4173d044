// RecordStore: per-source quotas. Every held item a remote peer wrote is charged to that peer
// (bytes as Slot::size_of counts them, and one record); a put that would take the peer past
// Limits::max_bytes_per_source or max_records_per_source is refused (refuse-new). The charge
// moves to whoever writes a newer version of the item, and goes away with the item (expiry,
// or a plain write that removes older dictionary entries).
#include "starling/dht/store.hpp"

namespace starling::dht {

RecordStore::Usage RecordStore::usage_of(const net::PeerId& source) const {
  auto it = usage_.find(source);
  return it == usage_.end() ? Usage{} : it->second;
}

result<void> RecordStore::check_quota(const DhtId& id, const std::optional<SubKey>& subkey,
                                      const RecordBody& body, const net::PeerId& source) const {
  Usage u = usage_of(source);
  // Replacing an item this peer already pays for only costs the difference.
  if (auto k = charges_.find(id); k != charges_.end())
    if (auto c = k->second.find(subkey); c != k->second.end() && c->second.source == source) {
      u.bytes -= c->second.bytes;
      u.records -= 1;
    }
  const std::size_t bytes = u.bytes + Slot::size_of(subkey, body);
  if (limits_.max_records_per_source && u.records + 1 > limits_.max_records_per_source)
    return make_error(dht_errc::capacity, "peer " + source.short_string() + " keeps " +
                                              std::to_string(u.records) + " records here (quota " +
                                              std::to_string(limits_.max_records_per_source) + ")");
  if (limits_.max_bytes_per_source && bytes > limits_.max_bytes_per_source)
    return make_error(dht_errc::capacity, "peer " + source.short_string() + " would keep " +
                                              std::to_string(bytes) + " bytes here (quota " +
                                              std::to_string(limits_.max_bytes_per_source) + ")");
  return success();
}

void RecordStore::uncharge(Charges& charges, Charges::iterator it) {
  auto u = usage_.find(it->second.source);
  if (u != usage_.end()) {
    u->second.bytes -= std::min(u->second.bytes, it->second.bytes);
    u->second.records -= std::min<std::size_t>(u->second.records, 1);
    if (u->second.records == 0) usage_.erase(u);
  }
  charges.erase(it);
}

void RecordStore::charge(const DhtId& id, const std::optional<SubKey>& subkey,
                         const RecordBody& body, const net::PeerId* source) {
  auto k = charges_.find(id);
  if (k != charges_.end())
    if (auto c = k->second.find(subkey); c != k->second.end()) uncharge(k->second, c);
  if (source) {
    if (k == charges_.end()) k = charges_.try_emplace(id).first;
    const std::size_t bytes = Slot::size_of(subkey, body);
    k->second.emplace(subkey, Charge{*source, bytes, body.version});
    Usage& u = usage_[*source];
    u.bytes += bytes;
    u.records += 1;
  }
  if (k != charges_.end() && k->second.empty()) charges_.erase(k);
}

void RecordStore::reconcile(const DhtId& id) {
  auto k = charges_.find(id);
  if (k == charges_.end()) return;
  auto s = slots_.find(id);
  for (auto c = k->second.begin(); c != k->second.end();) {
    auto next = std::next(c);
    const Entry* e = s == slots_.end() ? nullptr : s->second.slot.find(c->first);
    if (!e || e->body.version != c->second.version ||
        Slot::size_of(c->first, e->body) != c->second.bytes)
      uncharge(k->second, c);
    c = next;
  }
  if (k->second.empty()) charges_.erase(k);
}

}  // namespace starling::dht
