#include "starling/dht/store.hpp"

namespace starling::dht {

result<MergeResult> RecordStore::put(const RecordKey& key, const std::optional<SubKey>& subkey,
                                     const RecordBody& body, TimePoint deadline, TimePoint now,
                                     const net::PeerId* source) {
  if (deadline <= now) return make_error(dht_errc::expired, "key " + key.to_string());
  auto it = slots_.find(key.id());
  if (it != slots_.end()) expire_item(it, now);
  it = slots_.find(key.id());
  const std::size_t added = body.value.size() + body.signature.size() +
                            (subkey ? subkey->raw().size() : 0) + key.raw().size() + 64;
  if (it == slots_.end()) {
    if (slots_.size() >= limits_.max_keys)
      return make_error(dht_errc::capacity, std::to_string(slots_.size()) + " keys held");
  } else if (subkey && !it->second.slot.find(subkey) &&
             it->second.slot.dictionary().size() >= limits_.max_subkeys_per_key) {
    return make_error(dht_errc::capacity, "key " + key.to_string() + " holds " +
                                              std::to_string(limits_.max_subkeys_per_key) +
                                              " sub-keys");
  }
  if (it != slots_.end()) {
    const Entry* held = it->second.slot.find(subkey);
    const std::size_t replaced = held ? Slot::size_of(subkey, held->body) : 0;
    const std::size_t projected =
        it->second.slot.byte_size() - replaced + Slot::size_of(subkey, body);
    if (projected > limits_.max_bytes_per_key)
      return make_error(dht_errc::capacity, "key " + key.to_string() + " would hold " +
                                                std::to_string(projected) + " bytes (limit " +
                                                std::to_string(limits_.max_bytes_per_key) + ")");
  } else if (Slot::size_of(subkey, body) > limits_.max_bytes_per_key) {
    return make_error(dht_errc::capacity, "record of " + std::to_string(body.value.size()) +
                                              " bytes exceeds the per-key limit");
  }
  if (bytes_ + added > limits_.max_bytes)
    return make_error(dht_errc::capacity, std::to_string(bytes_) + " bytes held");
  if (source) ST_TRY(check_quota(key.id(), subkey, body, *source));
  if (it == slots_.end()) {
    it = slots_.emplace(key.id(), Item{key, Slot{}}).first;
    bytes_ += key.raw().size();
  }
  const std::size_t before = it->second.slot.byte_size();
  const MergeResult r = it->second.slot.merge(subkey, body, deadline);
  bytes_ = bytes_ - before + it->second.slot.byte_size();
  if (r == MergeResult::stored) {
    charge(key.id(), subkey, body, source);
    if (!subkey) reconcile(key.id());  // a plain write drops older dictionary entries
  }
  if (it->second.slot.empty()) {  // cannot happen after a merge, kept for the invariant
    bytes_ -= it->second.key.raw().size();
    slots_.erase(it);
  }
  return r;
}

std::vector<Record> RecordStore::records(const DhtId& id, TimePoint now) const {
  auto it = slots_.find(id);
  if (it == slots_.end()) return {};
  return it->second.slot.to_records(now);
}

const Slot* RecordStore::find(const DhtId& id, TimePoint now) {
  auto it = slots_.find(id);
  if (it == slots_.end()) return nullptr;
  expire_item(it, now);
  it = slots_.find(id);
  return it == slots_.end() ? nullptr : &it->second.slot;
}

const RecordKey* RecordStore::key_of(const DhtId& id) const {
  auto it = slots_.find(id);
  return it == slots_.end() ? nullptr : &it->second.key;
}

void RecordStore::expire_item(std::unordered_map<DhtId, Item>::iterator it, TimePoint now) {
  const std::size_t before = it->second.slot.byte_size();
  const std::size_t items = it->second.slot.item_count();
  it->second.slot.expire(now);
  bytes_ = bytes_ - before + it->second.slot.byte_size();
  const DhtId id = it->first;
  const bool dropped = it->second.slot.item_count() != items;
  if (it->second.slot.empty()) {
    bytes_ -= it->second.key.raw().size();
    slots_.erase(it);
  }
  if (dropped) reconcile(id);
}

void RecordStore::expire(TimePoint now) {
  for (auto it = slots_.begin(); it != slots_.end();) {
    auto next = std::next(it);
    expire_item(it, now);
    it = next;
  }
}

std::size_t RecordStore::item_count() const {
  std::size_t n = 0;
  for (const auto& [id, item] : slots_) n += item.slot.item_count();
  return n;
}

void RecordStore::for_each(const std::function<void(const RecordKey&, const Slot&)>& f) const {
  for (const auto& [id, item] : slots_) f(item.key, item.slot);
}

}  // namespace starling::dht
