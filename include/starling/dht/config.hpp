// Configuration of the DHT protocol core: plain structs with documented defaults.
//
// Threading rule: plain values.
#pragma once

#include <cstddef>

#include "starling/dht/id.hpp"

namespace starling::dht {

// Size limits for everything a peer can send. Decoders and the store enforce them; a peer
// exceeding them gets errc::too_large / protocol_violation and a warning in the log.
struct WireLimits {
  std::size_t max_message_bytes = 4 << 20;  // one encoded request or response
  std::size_t max_key_bytes = 1024;         // a record key
  std::size_t max_subkey_bytes = 1024;      // a dictionary sub-key
  std::size_t max_value_bytes = 256 << 10;  // one value
  std::size_t max_signature_bytes = 128;    // Ed25519 signatures are 64
  std::size_t max_records_per_message = 4096;
  std::size_t max_targets_per_find = 64;     // keys per find request
  std::size_t max_peers_per_response = 512;  // distinct peers in one find response
  std::size_t max_peers_per_target = 64;     // peers listed for one key
  std::size_t max_addrs_per_peer = 8;
  std::size_t max_addr_bytes = 256;
  // Length-delimited fields (records, strings, sub-messages) in one message, counted before
  // protobuf allocates them.
  std::size_t max_wire_elements = 65536;
};

struct DhtConfig {
  // Kademlia k: bucket size, and the number of closest nodes a lookup returns.
  std::size_t k = 20;
  // Parallel requests per lookup (Kademlia alpha).
  std::size_t alpha = 3;
  // A lookup queries only the `beam_width` closest candidates it knows (0 = k) and ends
  // when they have all answered or failed.
  std::size_t beam_width = 0;
  // Nodes a value is stored on: the closest `replicas` live nodes to the key (0 = k). With
  // 8 replicas a record survives the loss of a random 30% of the nodes with probability
  // 1 - 0.3^8 > 0.9999 even before republishing moves it.
  std::size_t replicas = 8;
  // The beam of a store's lookup (0 = replicas): it needs the `replicas` closest live nodes,
  // not the k closest, so it converges after fewer rounds. Slow and failed candidates do not
  // count toward it (lookup.hpp), so dead replicas push the window on to live ones.
  std::size_t store_beam_width = 0;
  // Parallel requests of a store's lookup (0 = its beam): every node of the beam must answer
  // anyway, so asking them at once saves rounds (ceil(beam / alpha) at least) at no extra
  // requests when the routing table already knows the closest nodes.
  std::size_t store_alpha = 0;
  // A store reports success once this many replicas hold the records (0 = a majority of the
  // replicas); the requests to the other replicas complete in the background.
  std::size_t store_quorum = 0;
  // A node that answers a store's lookup from inside the current `replicas` closest gets the
  // records at once rather than after the lookup converged (one round less; a node displaced
  // later by a closer one keeps an extra copy).
  bool store_early = true;
  // A store's replicas (the closest nodes its lookup found) are remembered for this long
  // (0 = never): a store of the same key within it goes straight to them without a lookup,
  // as writers re-announce the same keys; if fewer than the quorum accept, it runs the
  // lookup after all. At most `store_cache_keys` keys are remembered.
  Duration store_cache_ttl = 30s;
  std::size_t store_cache_keys = 4096;
  // Holders of a rewritten key: the nodes that accepted this node's stores of a key (at most
  // `store_holders` per key, the closest to it kept; at most `store_holder_keys` keys, least
  // recently stored dropped first) get every later store of that key as well as the nodes its
  // lookup finds, so a new version reaches the nodes holding the old one and a get that meets
  // them first does not return it (routing tables are partial: successive lookups can end on
  // different closest sets). A holder that fails `max_failures` stores in a row is forgotten.
  // 0 = off.
  std::size_t store_holders = 32;
  std::size_t store_holder_keys = 4096;
  // Admission of lookup-learned nodes: a node named in a lookup answer (not yet in the table,
  // its bucket with room) is pinged in the background while no caller's operation runs,
  // `admit_parallel` at a time, at most `admit_queue` waiting; its answer is the liveness proof
  // that puts it into the table (a client's answer keeps it out; a failure blacklists it).
  // Off by default: at 128-256 nodes it cut a first store's dials (3.4 -> 1.5 per store) but
  // made gets slower (p50 2.1 -> 5.9 ms; docs/benchmarks.md, DHT).
  bool admit_learned = false;
  std::size_t admit_parallel = 2;
  std::size_t admit_queue = 256;
  // Replication on join (Kademlia section 2.5; core_replicate.cpp): a node that sees a
  // newcomer (its self-lookup, or its first entry into the routing table) sends it the records
  // of the keys for which it is among the `replicas` closest, if this node is among the
  // `replicate_senders` closest holders it knows; at most `replicate_max_records` per newcomer,
  // and once per `replicate_cooldown`. The newcomer validates them like any store.
  bool replicate_on_join = true;
  std::size_t replicate_senders = 3;
  std::size_t replicate_max_records = 4096;
  Duration replicate_cooldown = 5s;
  // Requests needing a new connection (the networked node's hint: no connection open to the
  // peer) that a plain get keeps in flight at once (0 = no limit). It needs one holder of the
  // value, and opening a connection (TCP, Noise XX, yamux) costs more than a round trip: the
  // closest unconnected candidate is dialled alone while the other alpha slots go to connected
  // candidates further down the beam (measured at 256 nodes: gets that went to unconnected
  // nodes dialled 3 at a time on the getter's one thread; docs/benchmarks.md, DHT).
  std::size_t get_dials = 1;
  // Caching along the path: a get that found a value stores a copy on the closest node it
  // asked that lacked it, with the record's remaining ttl cut to `cache_ttl`, halved for every
  // node beyond the `replicas` closest that the lookup knows closer to the key than that node
  // (nobody rewrites a cached copy, so it must not outlive a rewrite by long). Only over an
  // open connection (never a dial for a cache copy). 0 = no caching.
  Duration cache_ttl = 30s;
  // Relaxed bucket splitting (Kademlia paper section 4.2): a bucket that does not cover our
  // own id also splits while its depth is not a multiple of this (0 = classic rule: only the
  // bucket covering our id splits). 5 gives routing tables of ~16 buckets per level, fewer
  // hops, more entries.
  std::size_t split_depth_modulo = 5;
  // Replacement cache entries per bucket (0 = k).
  std::size_t replacement_cache = 0;
  // A routing-table node that failed this many requests in a row is dropped even when no
  // replacement is waiting (with a replacement, one failure suffices).
  std::size_t max_failures = 3;

  // Per-request deadline; after `slow_request` the lookup stops waiting for the answer to
  // spend its parallelism elsewhere (the answer is still used if it comes in time).
  Duration request_timeout = 3s;
  Duration slow_request = 1s;
  // The soft timeout adapts to the answers seen: srtt + 4 * rttvar of this node's answered
  // requests (as TCP's retransmission timer), kept within [slow_request_min, slow_request].
  Duration slow_request_min = 100ms;
  // A whole get/store/find operation never takes longer than this.
  Duration operation_timeout = 30s;

  // Refresh rounds (core_refresh.cpp). After joining, a node refreshes every bucket that does
  // not cover its own id (one lookup of a random id inside it). With `refresh_splits`, that
  // round goes on while buckets created by the splits its answers caused hold none of its
  // targets yet: those are refreshed too (each at most once per round), so the table covers
  // every region of the id space down to the depth its buckets reach, not only the few buckets
  // that existed when the self-lookup ended (a far bucket splits only once full, so one lookup
  // fills one sub-range of it and keys in the others have no known holder). With
  // `refresh_growth` > 0, a node whose table has grown to that many times its size at the end
  // of its last round (the network grew after it joined) runs another round. Rounds beyond the
  // join's first batch start lookups only while the networked node allows background dials
  // (its warm-connection bound). Off by default: at 256 nodes on loopback it took gets that
  // open a connection from 15-18% to none and a first store from 11 to 3-7 ms, but tables (and
  // connections) roughly doubled, the join took 3-4x as long, and in the lossy rewrite
  // simulation (tests/dht/rewrite_test.cpp) stale copies rose beyond its bounds, not yet
  // explained (docs/benchmarks.md, DHT).
  bool refresh_splits = false;
  double refresh_growth = 0;
  // Buckets not touched by a lookup or an answer for this long are refreshed by a lookup of
  // a random id inside them.
  Duration refresh_interval = 10min;
  // Own records (stored through this node) are pushed again to the current closest nodes
  // this often, with their remaining ttl, until they expire (0 = never).
  Duration republish_interval = 5min;
  // How often the core runs its housekeeping (expiry sweep, refresh and republish checks).
  Duration maintenance_interval = 5s;

  // Unresponsive peers are not contacted for blacklist_base * 2^(failures-1), capped.
  Duration blacklist_base = 5s;
  Duration blacklist_max = 5min;
  std::size_t blacklist_capacity = 10000;

  // Records may not ask to live longer than this (longer ttls are cut to it).
  Millis max_ttl = std::chrono::hours(24);
  // Wall clocks of honest peers differ by less than this. Used only to bound the window in
  // which a signed record is accepted (its version +- skew, its lifetime + skew).
  Millis max_clock_skew = std::chrono::minutes(10);

  // Local store capacity.
  std::size_t max_stored_keys = 100000;
  std::size_t max_subkeys_per_key = 4096;
  std::size_t max_stored_bytes = 256 << 20;
  // Records of one key (all its sub-keys); at most half of limits.max_message_bytes.
  std::size_t max_bytes_per_key = 2 << 20;
  // Abuse bounds on what peers send us to store. A store request's records beyond
  // `max_records_per_store` are answered `full` without being looked at (each may cost a
  // signature check); this node's own store requests and replication pushes stay within it.
  // What one remote peer keeps stored here (items it wrote that are still held) is capped at
  // `max_bytes_per_source` / `max_records_per_source`; beyond, its new records are refused
  // (`full`) while what it stored first stays (refuse-new). 0 = no limit.
  std::size_t max_records_per_store = 256;
  std::size_t max_bytes_per_source = 32 << 20;
  std::size_t max_records_per_source = 12500;
  // Warnings about one peer's rejected records or bad requests: at most one per this period.
  Duration peer_warning_interval = 10s;

  // Client mode: this node does not accept connections, so it never answers requests and
  // tells peers not to put it into their routing tables.
  bool client_mode = false;

  WireLimits limits;

  std::size_t effective_beam() const { return beam_width ? beam_width : k; }
  std::size_t effective_replicas() const { return replicas ? replicas : k; }
  std::size_t effective_store_beam(std::size_t replicas_wanted) const {
    return store_beam_width ? store_beam_width : replicas_wanted;
  }
  std::size_t effective_store_alpha(std::size_t replicas_wanted) const {
    return store_alpha ? store_alpha : effective_store_beam(replicas_wanted);
  }
  std::size_t effective_store_quorum(std::size_t replicas_wanted) const {
    const std::size_t q = store_quorum ? store_quorum : replicas_wanted / 2 + 1;
    return q < replicas_wanted ? q : replicas_wanted;
  }
  std::size_t effective_replacements() const { return replacement_cache ? replacement_cache : k; }
};

}  // namespace starling::dht
