// DHT values and the merge rule. A key holds a plain value and/or a dictionary of sub-keys;
// every item carries its writer's version stamp and expires on its own. Slot is the state of
// one key; the local store and every get merge through Slot::merge, so replicas converge to
// the same state whatever order records arrive in.
//
// Newest wins, precisely: body A is newer than body B iff (A.version, A.value, A.lifetime,
// A.signature) > (B.version, B.value, B.lifetime, B.signature) lexicographically (bytes
// compared as unsigned, shorter prefix first). Versions are microseconds since the Unix epoch
// from the writer's hybrid clock (VersionClock), so one writer's later write always wins and
// ties between writers are broken by the value bytes, identically on every node.
// A plain write with version v replaces the dictionary entries with version <= v; a
// dictionary entry with version <= the plain value's version is stale. While the dictionary
// is non-empty, it is the key's value (the older plain value is kept only as the floor for
// that rule, until it expires).
//
// Expiry: records travel with a time-to-live relative to the sender (`ttl`); a holder keeps a
// local monotonic deadline and forwards the remaining time, so clocks never need to agree.
//
// Threading rule: plain values; no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "starling/dht/id.hpp"

namespace starling::dht {

// What the writer fixes (and an owner signs, together with the key and sub-key).
struct RecordBody {
  Bytes value;
  std::uint64_t version = 0;  // writer's stamp, microseconds since the Unix epoch
  Millis lifetime{0};         // signed lifetime counted from `version` (owned records; else 0)
  Bytes signature;            // owner's Ed25519 signature (owned records; else empty)

  friend bool operator==(const RecordBody&, const RecordBody&) = default;
};

// True iff `a` is newer than `b` (see the header comment).
bool newer(const RecordBody& a, const RecordBody& b) noexcept;

// A record as it travels: no sub-key for a plain value.
struct Record {
  std::optional<SubKey> subkey;
  RecordBody body;
  Millis ttl{0};  // remaining time-to-live at the sender

  friend bool operator==(const Record&, const Record&) = default;
};

// A held item: its body and local monotonic deadline.
struct Entry {
  RecordBody body;
  TimePoint deadline;
};

enum class MergeResult {
  stored,     // new or newer: now held
  refreshed,  // identical body already held; deadline extended
  unchanged,  // identical body already held with a later deadline
  stale,      // older than what is held: ignored
};

// The state of one key.
class Slot {
 public:
  // Merges one item expiring at `deadline`.
  MergeResult merge(const std::optional<SubKey>& subkey, const RecordBody& body,
                    TimePoint deadline);
  // Merges everything `other` holds.
  void merge_all(const Slot& other);
  // Drops items whose deadline is <= now.
  void expire(TimePoint now);

  bool empty() const noexcept { return !plain_ && dict_.empty(); }
  bool is_dictionary() const noexcept { return !dict_.empty(); }
  const std::optional<Entry>& plain() const noexcept { return plain_; }
  const std::map<SubKey, Entry>& dictionary() const noexcept { return dict_; }
  // The item held for `subkey` (nullopt = the plain value), if any.
  const Entry* find(const std::optional<SubKey>& subkey) const;
  // Everything held, with the remaining ttl at `now` (items expired at `now` are skipped).
  std::vector<Record> to_records(TimePoint now) const;
  // Bytes held (values, sub-keys, signatures), for store accounting.
  std::size_t byte_size() const noexcept { return bytes_; }
  std::size_t item_count() const noexcept { return dict_.size() + (plain_ ? 1 : 0); }
  // Latest deadline of any item (nullopt if empty).
  std::optional<TimePoint> last_deadline() const;
  // The bytes one item counts for in byte_size().
  static std::size_t size_of(const std::optional<SubKey>& sk, const RecordBody& b) noexcept;

 private:
  std::optional<Entry> plain_;
  std::map<SubKey, Entry> dict_;
  std::size_t bytes_ = 0;
};

// Issues record versions: microseconds since the Unix epoch from the local wall clock, never
// repeating and never going backwards (a hybrid clock), so one writer's writes are ordered
// even if its wall clock steps back.
class VersionClock {
 public:
  std::uint64_t next(WallTime wall) noexcept;
  // Moves the clock past a version seen elsewhere (ignored if beyond wall + max_skew, so a
  // peer cannot push it arbitrarily far).
  void observe(std::uint64_t version, WallTime wall, Millis max_skew) noexcept;

 private:
  std::uint64_t last_ = 0;
};

}  // namespace starling::dht
