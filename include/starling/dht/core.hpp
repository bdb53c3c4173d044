// DhtCore: the whole Kademlia protocol of one node as a state machine that does no I/O and
// takes time as a parameter, so the same code runs over real sockets (DhtNode) and in a
// deterministic simulation with thousands of nodes.
//
// Driving it:
//   * inbound:  resp = core.handle_request(from, request, now)  -> send resp back
//   * outbound: while (auto out = core.poll_request()) send out->request to out->to; then
//               core.on_response(out->id, response, now) or core.on_failure(out->id, err, now)
//               (a request not answered by out->deadline fails by itself in tick())
//   * timers:   call core.tick(now) at core.next_wakeup() (or earlier; it is idempotent)
//   * results:  while (auto r = core.poll_result()) ... (one per get/store/find/bootstrap)
// The caller sends every polled request; the core bounds how many are in flight.
//
// Threading rule: one DhtCore belongs to one thread (its node's io_context); no locks.
#pragma once

#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "starling/dht/blacklist.hpp"
#include "starling/dht/config.hpp"
#include "starling/dht/lookup.hpp"
#include "starling/dht/messages.hpp"
#include "starling/dht/routing_table.hpp"
#include "starling/dht/store.hpp"
#include "starling/dht/validator.hpp"

namespace starling::dht {

struct GetOptions {
  // false: finish early: as soon as one node returns a fresh valid plain value, or once
  //        `dictionary_quorum` nodes returned dictionaries (merged, newest per sub-key). A
  //        value held locally counts as one answer, with 0 hops.
  // true:  run the lookup until it converges on the closest nodes and merge every value
  //        found there, for readers that must not miss a recent write on a lagging replica.
  bool latest = false;
  // Dictionaries are written piecewise by many writers, so one replica may lack entries
  // another has; merging a few answers (they arrive together, alpha requests are in
  // flight near the key) costs little time.
  std::size_t dictionary_quorum = 3;
};

struct StoreOptions {
  std::size_t replicas = 0;  // nodes to store on (0 = DhtConfig::replicas)
  // Replicas that must hold the records before the store reports (0 = DhtConfig::store_quorum);
  // the other store requests complete in the background.
  std::size_t quorum = 0;
  // Remember the records as this node's own and push them again every republish_interval
  // (with their remaining ttl) until they expire, so they survive churn.
  bool republish = true;
};

enum class OpKind { bootstrap, find_node, get, store };

// What became of a store request to one replica.
enum class StoreAck : std::uint8_t { pending, held, refused, failed };

struct LookupStats {
  std::size_t hops = 0;  // see lookup.hpp (get: hop of the first node that had the value)
  std::size_t requests = 0;
  std::size_t responses = 0;
  std::size_t failures = 0;
};

struct OpResult {
  OpId id{};
  OpKind kind = OpKind::find_node;
  // get: not_found when no node had the key; all: unavailable when no node answered,
  // timeout after operation_timeout; store: the reason when no node accepted.
  result<void> status = success();
  Slot value;                    // get: everything found, merged
  std::vector<Contact> closest;  // bootstrap / find_node / store: closest live nodes
  std::size_t stored = 0;        // store: nodes that hold the records when it reported (this
                                 // one included; >= the quorum on success, more may follow)
  std::size_t refused = 0;       // store: nodes that answered but kept something newer
  LookupStats stats;
};

struct OutgoingRequest {
  RequestId id{};
  Contact to;
  Request request;
  TimePoint deadline;  // the core fails the request by itself at this time
};

class DhtCore {
 public:
  DhtCore(DhtConfig config, net::PeerId self, ValidatorChain validators, std::uint64_t seed,
          TimePoint now = {});
  DhtCore(const DhtCore&) = delete;
  DhtCore& operator=(const DhtCore&) = delete;

  // --- inbound ---------------------------------------------------------------------------
  // Answers a request from `from` (authenticated by the transport). Non-client senders that
  // are not blacklisted enter the routing table with the addresses in request.sender.
  Response handle_request(const net::PeerId& from, const Request& request, const Now& now);

  // --- outbound --------------------------------------------------------------------------
  std::optional<OutgoingRequest> poll_request();
  void on_response(RequestId id, const Response& response, const Now& now);
  void on_failure(RequestId id, const Error& error, const Now& now);

  // --- operations (each yields exactly one OpResult) --------------------------------------
  // Joins through `seeds` (their addresses as known): a lookup of our own id, then a refresh
  // of every bucket. Fails with errc::unavailable if none of them answers.
  OpId bootstrap(std::vector<Contact> seeds, const Now& now);
  OpId find_node(const DhtId& target, const Now& now);
  // Concurrent gets of one key share one lookup (a `latest` get joins only a `latest` one).
  OpId get(const RecordKey& key, GetOptions options, const Now& now);
  // Validates `records` (fails at once, sending nothing, if one is invalid) and stores them
  // on the closest live nodes to the key, this node included if it is among them.
  OpId store(const RecordKey& key, std::vector<Record> records, StoreOptions options,
             const Now& now);
  std::optional<OpResult> poll_result();

  // --- time ------------------------------------------------------------------------------
  void tick(const Now& now);
  TimePoint next_wakeup() const;

  // --- state -----------------------------------------------------------------------------
  const DhtId& id() const noexcept { return self_.id; }
  const net::PeerId& peer() const noexcept { return self_.peer; }
  const DhtConfig& config() const noexcept { return cfg_; }
  void set_addresses(std::vector<Bytes> addrs) { self_.addrs = std::move(addrs); }
  // Switches client mode at run time (DhtNode::set_reachable): from the next request on,
  // peers are told to keep this node out of their routing tables (or may add it again).
  void set_client_mode(bool on) { cfg_.client_mode = on; }
  const RoutingTable& routing() const noexcept { return routing_; }
  const RecordStore& records() const noexcept { return store_; }
  const Blacklist& blacklist() const noexcept { return blacklist_; }
  const ValidatorChain& validators() const noexcept { return validators_; }
  std::size_t pending_requests() const noexcept { return pending_.size(); }
  std::size_t active_operations() const noexcept { return ops_.size(); }
  std::size_t own_record_keys() const noexcept { return own_.size(); }
  // Keys whose store holders this node remembers (DhtConfig::store_holders).
  std::size_t holder_keys() const noexcept { return holders_.size(); }
  // Admission pings (DhtConfig::admit_learned) are sent only while open; the networked node
  // closes it while its host holds as many connections as it wants to (file descriptors).
  void set_admission_open(bool open, const Now& now);
  std::size_t admissions_waiting() const noexcept { return admit_queue_.size(); }
  std::uint64_t admissions_sent() const noexcept { return admit_sent_; }
  // Records sent to newcomers by replication on join (DhtConfig::replicate_on_join).
  std::uint64_t replicated_records() const noexcept { return replicated_records_; }
  VersionClock& version_clock() noexcept { return versions_; }
  // Whether a request to a peer would go over an open connection (set by the networked node;
  // without it every peer counts as connected). Gets limit their dials with it (get_dials).
  // Whether a warning about `peer` may be logged now (at most one per peer per
  // DhtConfig::peer_warning_interval; a flood of bad records must not flood the log).
  bool warn_allowed(const net::PeerId& peer, TimePoint now);
  void set_connected_hint(std::function<bool(const net::PeerId&)> hint) {
    connected_ = std::move(hint);
  }
  // Whether background work may open new connections now (set by the networked node: its
  // warm-connection bound; without it, always). Refresh rounds beyond the join's first batch
  // of bucket refreshes start lookups only while it says yes.
  void set_background_dials_hint(std::function<bool()> hint) { may_dial_ = std::move(hint); }
  // Refresh rounds (DhtConfig::refresh_splits, refresh_growth): whether one is running, how many
  // ran, and the refresh lookups they started.
  bool refreshing() const noexcept { return refresh_round_; }
  std::size_t refresh_rounds() const noexcept { return refresh_rounds_; }
  std::uint64_t refresh_lookups() const noexcept { return refresh_lookups_; }

 private:
  enum class Purpose : std::uint8_t { lookup, store, ping, cache, admit, replicate };
  enum class TimerKind : std::uint8_t { request_deadline, request_slow, op_deadline };
  struct Timer {
    TimePoint at;
    TimerKind kind;
    std::uint64_t id;
    friend auto operator<=>(const Timer&, const Timer&) = default;
  };
  struct Pending {
    Contact to;
    std::uint64_t op = 0;  // 0 = none
    Purpose purpose = Purpose::ping;
    TimePoint deadline, slow_at;
    TimePoint sent;
  };
  struct Operation {
    std::uint64_t id = 0;
    OpKind kind = OpKind::find_node;
    bool internal = false;  // refresh/republish: no OpResult
    bool round = false;     // find_node: a lookup of the current refresh round
    RecordKey key;
    std::optional<Lookup> lookup;
    TimePoint deadline;
    LookupStats stats;
    std::size_t seeds = 0;                           // bootstrap
    bool latest = false;                             // get
    std::size_t quorum = 1;                          // get: dictionary answers that suffice
    std::size_t value_answers = 0;                   // get: answers that carried a valid value
    Slot found;                                      // get: merged values; store: the payload
    std::size_t found_hop = 0;                       // get
    std::vector<std::uint64_t> joined;               // get: ops sharing this lookup
    std::optional<Contact> closest_without_value;    // get: cache target
    std::size_t replicas = 0;                        // store
    std::size_t store_quorum = 1;                    // store: acks that suffice to report
    bool reported = false;                           // its OpResult is out (store: quorum)
    bool storing = false;                            // store: lookup done, store requests out
    std::size_t stored = 0, refused = 0;             // store
    std::unordered_map<DhtId, StoreAck> store_acks;  // store: every replica request sent
    std::vector<DhtId> store_targets;                // store: the final replicas (not self)
    StoreAck local_ack = StoreAck::failed;           // store: this node as a replica
    bool from_cache = false;                         // store: replicas of an earlier store
  };
  struct StoreCache {  // the replicas of a recent store of one key
    std::vector<Contact> targets;
    bool local = false;
    std::size_t replicas = 0;
    TimePoint until;
  };
  struct Holders {  // nodes that accepted this node's stores of one key
    std::vector<Contact> nodes;
    std::vector<std::uint8_t> failures;  // per node: store requests failed in a row
    bool local = false;
    std::list<DhtId>::iterator lru;
  };
  struct OwnRecord {
    RecordKey key;
    Slot slot;
    TimePoint next_republish;
  };

  // core.cpp
  Operation& new_op(OpKind kind, bool internal, const Now& now);
  RequestId send(const Contact& to, decltype(Request::body) body, Purpose purpose, std::uint64_t op,
                 const Now& now);
  NodeHeader header() const;
  void finish(std::uint64_t op, result<void> status, const Now& now);
  void report(Operation& op, result<void> status, const Now& now);
  void fail_request(std::uint64_t rid, const Error& error, const Now& now);
  void note_alive(const Contact& who, const NodeHeader& header, const Now& now);
  void note_failure(const Contact& who, const Now& now);
  void ping_for_eviction(const std::optional<RoutingTable::PingAction>& action, const Now& now);
  void note_rtt(Duration sample);
  Duration slow_after() const;
  ValidationContext validation_context(const Now& now) const;
  // core_server.cpp
  Response handle_store(const net::PeerId& from, const StoreRequest& req, const Now& now);
  Response handle_find(const net::PeerId& from, const FindRequest& req, const Now& now);
  // core_lookup.cpp
  void start_lookup(Operation& op, const DhtId& target, const std::vector<Contact>& seeds,
                    const Now& now, std::size_t beam = 0, std::size_t alpha = 0);
  void pump(std::uint64_t op, const Now& now);
  void on_find_response(Operation& op, const Contact& from, const FindResult& res, const Now& now);
  void lookup_done(Operation& op, const Now& now);
  std::vector<Contact> contacts_of(const std::vector<PeerInfo>& peers) const;
  // `round`: one of the current refresh round's lookups (counted in refresh_in_flight_).
  std::uint64_t start_find(const DhtId& target, bool internal, const Now& now, bool round = false);
  // core_store.cpp
  std::uint64_t start_store(const RecordKey& key, Slot payload, std::size_t replicas,
                            std::size_t quorum, bool internal, const Now& now);
  void start_store_phase(Operation& op, const Now& now);
  void store_on(Operation& op, std::vector<Contact> targets, bool local, const Now& now);
  void send_store(Operation& op, const Contact& to, const Now& now);
  void store_early(Operation& op, const Contact& from, const Now& now);
  void on_store_answer(std::uint64_t op, const Contact& from, StoreAck ack, const Now& now);
  static StoreAck store_ack_of(const StoreResponse& resp);
  void check_store(std::uint64_t op, const Now& now);
  void finish_store(std::uint64_t op, const Now& now);
  void cache_along_path(Operation& op, const Now& now);
  result<void> accept_records(const RecordKey& key, std::vector<Record>& records,
                              const Now& now) const;
  // core_holders.cpp
  Holders* holders_of(const DhtId& key, bool create);
  void note_holder(const DhtId& key, const Contact& who, StoreAck ack);
  void add_holders(Operation& op, std::vector<Contact>& targets, bool& local);
  // core_admit.cpp
  void consider_admission(const std::vector<Contact>& learned, const Now& now);
  void pump_admissions(const Now& now);
  void on_admit_done(const DhtId& id, const Now& now);
  bool foreground_busy() const;
  // core_refresh.cpp
  void begin_refresh_round(const Now& now, bool first);
  void continue_refresh_round(const Now& now);
  void start_round_lookups(const std::vector<DhtId>& targets, const Now& now);
  void end_refresh_round();
  void check_growth(const Now& now);
  // core_replicate.cpp
  void replicate_to(const Contact& to, const Now& now);
  void expire_replicated(const Now& now);
  // core_maintenance.cpp
  void maintenance(const Now& now);
  void republish(const Now& now);

  DhtConfig cfg_;
  Contact self_;
  ValidatorChain validators_;
  std::mt19937_64 rng_;
  RoutingTable routing_;
  RecordStore store_;
  Blacklist blacklist_;
  VersionClock versions_;

  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, Pending> pending_;
  std::unordered_map<std::uint64_t, Operation> ops_;
  std::unordered_map<DhtId, std::uint64_t> active_gets_;  // key id -> op sharing its lookup
  std::unordered_map<DhtId, OwnRecord> own_;
  std::unordered_map<DhtId, StoreCache> store_cache_;  // key id -> replicas of a recent store
  std::unordered_map<DhtId, Holders> holders_;         // key id -> nodes holding our stores of it
  std::list<DhtId> holders_lru_;                       // least recently stored first
  std::set<Timer> timers_;
  TimePoint next_maintenance_;
  Duration srtt_{}, rttvar_{};  // answered requests' round trip: smoothed, and its deviation
  bool rtt_known_ = false;
  std::deque<OutgoingRequest> outbox_;
  std::deque<Contact> admit_queue_;      // learned nodes waiting for an admission ping
  std::unordered_set<DhtId> admitting_;  // queued or pinged
  std::size_t admit_in_flight_ = 0;
  std::uint64_t admit_sent_ = 0;
  bool admit_open_ = true;
  std::deque<OpResult> results_;
  std::function<bool(const net::PeerId&)> connected_;
  std::function<bool()> may_dial_;
  bool refresh_round_ = false;          // a refresh round is running
  std::vector<DhtId> refresh_targets_;  // the current round's targets
  std::size_t refresh_in_flight_ = 0;   // its lookups not finished yet
  std::size_t refresh_size_ = 0;        // table size when the last round ended (0: none yet)
  std::size_t refresh_rounds_ = 0;
  std::uint64_t refresh_lookups_ = 0;
  std::unordered_map<DhtId, TimePoint> replicated_;  // newcomer -> end of its cooldown
  std::uint64_t replicated_records_ = 0;
  std::unordered_map<net::PeerId, TimePoint> warned_;  // peer -> last warning about it
};

}  // namespace starling::dht
