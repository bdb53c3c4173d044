// The local record store: one Slot per key id, with the key's bytes, capacity limits and
// expiry by local monotonic deadlines. Only validated records are put here.
//
// Threading rule: owned by one DhtCore; used from its thread only.
#pragma once

#include <functional>
#include <map>
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
    // What one remote peer may keep stored here (the items it wrote that are still held):
    // a put beyond either is refused (refuse-new: what the peer stored first stays, so a
    // flood cannot push out its own or anybody's earlier records). 0 = no limit.
    std::size_t max_bytes_per_source = 32 << 20;
    std::size_t max_records_per_source = 12500;
  };
  struct Usage {
    std::size_t bytes = 0, records = 0;
  };
  explicit RecordStore(Limits limits) : limits_(limits) {}
  RecordStore() : RecordStore(Limits{}) {}

  // Merges one (validated) item expiring at `deadline`. dht_errc::capacity if it would
  // exceed a limit, dht_errc::expired if deadline <= now.
  // `source`: the remote peer that sent it (charged to its quota; nullptr = this node's own).
  result<MergeResult> put(const RecordKey& key, const std::optional<SubKey>& subkey,
                          const RecordBody& body, TimePoint deadline, TimePoint now,
                          const net::PeerId* source = nullptr);
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
  // What `source` keeps stored here now (store_quota.cpp).
  Usage usage_of(const net::PeerId& source) const;

 private:
  // Who wrote a held item, and what it counts for (store_quota.cpp).
  struct Charge {
    net::PeerId source;
    std::size_t bytes = 0;
    std::uint64_t version = 0;
  };
  using Charges = std::map<std::optional<SubKey>, Charge>;
  result<void> check_quota(const DhtId& id, const std::optional<SubKey>& subkey,
                           const RecordBody& body, const net::PeerId& source) const;
  void charge(const DhtId& id, const std::optional<SubKey>& subkey, const RecordBody& body,
              const net::PeerId* source);
  void uncharge(Charges& charges, Charges::iterator it);
  // Drops the charges of items the key no longer holds (a plain write removed older
  // dictionary entries, or they expired).
  void reconcile(const DhtId& id);

  struct Item {
    RecordKey key;
    Slot slot;
  };
  void expire_item(std::unordered_map<DhtId, Item>::iterator it, TimePoint now);
  Limits limits_;
  std::unordered_map<DhtId, Item> slots_;
  std::size_t bytes_ = 0;
  std::unordered_map<DhtId, Charges> charges_;  // only items a remote peer wrote
  std::unordered_map<net::PeerId, Usage> usage_;
};

}  // namespace starling::dht
