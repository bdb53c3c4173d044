// The local record store: one Slot per key id, with the key's bytes, capacity limits and
// expiry by local monotonic deadlines. Only validated records are put here.
//
// Threading rule: owned by one DhtCore; used from its thread only.
#pragma once

#include <functional>
#include <unordered_map>

#include "starling/dht/error.hpp"
#include "starling/dht/record.hpp"

namespace starling::dht {

class RecordStore {
 public:
  struct Limits {
    std::size_t max_keys = 100000;
    std::size_t max_subkeys_per_key = 4096;
    std::size_t max_bytes = 256 << 20;
    // One key's records must fit in one find response (config: max_message_bytes / 2), or
    // no node could ever return them.
    std::size_t max_bytes_per_key = 2 << 20;
  };
  explicit RecordStore(Limits limits) : limits_(limits) {}
  RecordStore() : RecordStore(Limits{}) {}

  // Merges one (validated) item expiring at `deadline`. dht_errc::capacity if it would
  // exceed a limit, dht_errc::expired if deadline <= now.
  result<MergeResult> put(const RecordKey& key, const std::optional<SubKey>& subkey,
                          const RecordBody& body, TimePoint deadline, TimePoint now);
  // The fresh items under `id` with their remaining ttl (empty if none).
  std::vector<Record> records(const DhtId& id, TimePoint now) const;
  // The slot under `id` after dropping what expired (nullptr if nothing is left).
  const Slot* find(const DhtId& id, TimePoint now);
  const RecordKey* key_of(const DhtId& id) const;
  // Drops everything expired.
  void expire(TimePoint now);

  std::size_t key_count() const noexcept { return slots_.size(); }
  std::size_t total_bytes() const noexcept { return bytes_; }
  std::size_t item_count() const;
  void for_each(const std::function<void(const RecordKey&, const Slot&)>& f) const;

 private:
  struct Item {
    RecordKey key;
    Slot slot;
  };
  void expire_item(std::unordered_map<DhtId, Item>::iterator it, TimePoint now);
  Limits limits_;
  std::unordered_map<DhtId, Item> slots_;
  std::size_t bytes_ = 0;
};

}  // namespace starling::dht
