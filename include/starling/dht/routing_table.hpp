// Kademlia routing table: k-buckets covering the id space as a binary trie of prefixes.
// The bucket covering our own id splits when full; with split_depth_modulo = b > 0 any other
// bucket also splits while its depth is not a multiple of b (the relaxed rule of the
// Kademlia paper, section 4.2). A full bucket that cannot split keeps newcomers in a bounded
// replacement cache and asks the caller to ping its least-recently-seen node; the node is
// evicted (and the freshest replacement promoted) only if that ping fails. Buckets that saw
// neither a lookup in their range nor traffic with one of their nodes for a while are
// reported for refresh.
//
// Only nodes that proved alive and are not in client mode go in here; the caller decides that.
// No I/O: time is a parameter; pings are returned as actions.
//
// Threading rule: owned by one DhtCore; used from its thread only.
#pragma once

#include <optional>
#include <random>
#include <vector>

#include "starling/dht/id.hpp"

namespace starling::dht {

struct RoutingNode {
  Contact contact;
  TimePoint last_seen;
  std::size_t failures = 0;  // consecutive failed requests
};

struct Bucket {
  DhtId prefix;  // the bucket covers ids whose first `depth` bits equal prefix's
  std::size_t depth = 0;
  std::vector<RoutingNode> nodes;         // least recently seen first
  std::vector<RoutingNode> replacements;  // most recently seen last
  std::optional<DhtId> pinging;           // least-recently-seen node under an eviction ping
  TimePoint last_touched;

  bool covers(const DhtId& id) const noexcept { return id.common_prefix_length(prefix) >= depth; }
};

class RoutingTable {
 public:
  struct Options {
    std::size_t k = 20;
    std::size_t split_depth_modulo = 5;
    std::size_t replacements = 20;
    std::size_t max_failures = 3;
  };
  // Ping `node`, then report the outcome with on_ping_result().
  struct PingAction {
    Contact node;
  };

  RoutingTable(DhtId self, Options options, TimePoint now = {});

  // `contact` proved alive (answered us, or sent us a request and is not a client).
  std::optional<PingAction> on_seen(const Contact& contact, TimePoint now);
  // Outcome of an eviction ping: alive keeps the node (as most recently seen); dead evicts it
  // and promotes the freshest replacement.
  void on_ping_result(const DhtId& id, bool alive, TimePoint now);
  // A request to the node failed. It is dropped when a replacement is waiting or after
  // max_failures failures in a row. Returns true if it was dropped.
  bool on_failure(const DhtId& id);
  void remove(const DhtId& id);

  const RoutingNode* find(const DhtId& id) const;
  bool contains(const DhtId& id) const { return find(id) != nullptr; }
  // Whether on_seen(id) would put the node into the table at once (its bucket has room, or
  // would have after the splits the rules allow), rather than into a replacement cache.
  bool has_room(const DhtId& id) const;
  // Up to `count` nodes closest to `target`, closest first (never `exclude`).
  std::vector<Contact> closest(const DhtId& target, std::size_t count,
                               const std::optional<DhtId>& exclude = std::nullopt) const;
  // A lookup for `target` ran now: its bucket is fresh.
  void touch(const DhtId& target, TimePoint now);
  // Random ids inside the buckets not touched for `interval` (they are marked touched).
  std::vector<DhtId> refresh_targets(TimePoint now, Duration interval, std::mt19937_64& rng);
  // One random id inside every bucket (for the refresh after joining).
  std::vector<DhtId> all_bucket_targets(std::mt19937_64& rng) const;

  const DhtId& self() const noexcept { return self_; }
  std::size_t size() const noexcept { return size_; }
  // Changes whenever a node enters or leaves the table or a bucket splits (not when a known
  // node is seen again): what the warm-connection keeper watches.
  std::uint64_t version() const noexcept { return version_; }
  const std::vector<Bucket>& buckets() const noexcept { return buckets_; }
  const Options& options() const noexcept { return opt_; }

 private:
  std::size_t bucket_index(const DhtId& id) const;
  bool can_split(const Bucket& b) const;
  void split(std::size_t index);
  void promote_replacement(Bucket& b);

  DhtId self_;
  Options opt_;
  std::vector<Bucket> buckets_;  // sorted by prefix; their ranges partition the id space
  std::size_t size_ = 0;
  std::uint64_t version_ = 0;
};

}  // namespace starling::dht
