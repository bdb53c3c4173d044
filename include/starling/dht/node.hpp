// DhtNode: the networked DHT node. It runs a DhtCore (the protocol, no I/O) over a libp2p
// net::Host. Requests travel on a request channel (`/starling/dht/1.1.0`, channel.hpp): one
// long-lived stream per peer carrying many requests matched by id. A peer that does not serve
// it gets typed RPC calls (net/rpc.hpp) on `/starling/dht/1.0.0`, one call per request (also
// the path when a channel is full). Either way each message is one DHT message encoded by the
// DHT's own codec (messages.hpp) so that every byte from a peer passes its size-limited decoder.
// The node feeds the core the time, the messages that arrive and the answers to what it sent,
// fires its timers, and hands operation results to the waiting callers.
//
// Server mode serves the protocol and enters other nodes' routing tables; client mode (for
// peers that cannot accept connections) registers no handler, announces no address and is
// never put into a routing table, but gets and stores like anyone.
//
// Threading rule: a DhtNode belongs to its host's executor (one io thread); call its
// coroutines from there. Other threads use BlockingDhtNode below.
// Invariants: every operation ends by DhtConfig::operation_timeout (the core enforces it, the
// node adds a safety bound); stop() completes within DhtNodeConfig::stop_timeout; a peer that
// sends a malformed message gets that RPC call's stream closed with an error status, or its
// request channel reset, and a log line.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "starling/core/blocking.hpp"
#include "starling/dht/core.hpp"
#include "starling/net/autonat.hpp"
#include "starling/net/host.hpp"
#include "starling/net/rpc.hpp"

namespace google::protobuf {
class BytesValue;
}

namespace starling::dht {

inline constexpr const char* kDhtProtocol = "/starling/dht/1.0.0";

// The receive path of DhtNode, as plain functions (also driven by fuzz/fuzz_dht_session.cpp):
// `answer_request` decodes a request from `from` (size limits enforced), lets the core answer
// it and encodes the answer; a malformed request is an error (the node then closes that call
// with the reason). `accept_response` decodes the answer to request `id` and hands it to the
// core, or reports the request failed if the bytes are malformed (returning why).
result<Bytes> answer_request(DhtCore& core, const net::PeerId& from, BytesView request,
                             const Now& now);
result<void> accept_response(DhtCore& core, RequestId id, BytesView response, const Now& now);

struct DhtNodeConfig {
  DhtConfig dht;  // dht.client_mode selects client mode
  ValidatorChain validators = ValidatorChain::standard();
  // Addresses announced to peers (empty: the host's announce_addresses(): listen addresses with
  // 0.0.0.0 expanded, relay addresses). Needed behind a port mapping.
  std::vector<net::Multiaddr> announce;
  // Bootstrap: rounds over all initial peers, and the pause before round n (doubling from
  // bootstrap_backoff, at most 10 s).
  std::size_t bootstrap_attempts = 4;
  Duration bootstrap_backoff = 500ms;
  // Connecting to an initial peer given without /p2p/<id> (to learn its id).
  Duration dial_timeout = 5s;
  Duration stop_timeout = 5s;
  std::uint64_t seed = 0;  // routing randomness (0 = from std::random_device)
  // Warm connections: the node keeps connections open to up to `warm_connections` of its
  // routing-table nodes (far buckets first: each of their nodes covers more keys), dialling
  // missing ones in the background, `warm_parallel` at a time, so that lookups do not pay
  // TCP + Noise + yamux on their critical path. It dials only while its host holds fewer than
  // 2 * `warm_connections` connections in all, inbound ones included (the bound on file
  // descriptors: one per connection), and marks the warm ones keep-alive in the host; a node
  // that leaves the set (or the table) falls back to the host's idle timeout (which only the
  // dialling side applies). A failed warm dial is retried after `warm_retry`. 0 = off.
  std::size_t warm_connections = 256;
  std::size_t warm_parallel = 2;
  // How often the keeper checks whether the set must be recomputed: only after the routing
  // table's membership changed, a connection closed, a warm dial ended or a retry came due.
  Duration warm_interval = 1s;
  Duration warm_retry = 30s;
  // Request channels (channel.hpp). `use_channels`: send requests on them (off: one RPC
  // stream per request); `serve_channels`: answer them (server mode). A requester keeps at
  // most `channel_outstanding` requests unanswered on one channel (more go as RPC calls),
  // closes a channel idle for `channel_idle` or older than `channel_max_age` (a fresh stream
  // then: the host's idle clock sees the connection in use), and one whose request outlived
  // its deadline by `channel_grace`. A server accepts `channel_inbound_per_peer` channels
  // from one peer and closes one that completed no answer for `channel_server_idle`.
  bool use_channels = true;
  bool serve_channels = true;
  std::size_t channel_outstanding = 64;
  Duration channel_idle = 10s;
  Duration channel_max_age = 60s;
  Duration channel_grace = 1s;
  std::size_t channel_inbound_per_peer = 4;
  Duration channel_server_idle = 60s;
};

// Request-channel counters (diagnostics, tests, the benchmark).
struct ChannelStats {
  std::uint64_t opened = 0;    // channels this node opened as requester
  std::uint64_t sent = 0;      // requests sent on channels
  std::uint64_t rpc_sent = 0;  // requests sent as RPC calls (fallback or channels off)
  std::uint64_t answered = 0;  // answers received on channels
  std::uint64_t failed = 0;    // channels closed on an error (the requests on them failed)
  std::uint64_t fallback = 0;  // peers found not to serve channels (then RPC calls)
  std::uint64_t served = 0;    // requests this node answered on inbound channels
  std::uint64_t refused = 0;   // inbound channels refused (a peer over its bound)
  std::size_t open = 0;        // channels open now as requester
  std::size_t inbound = 0;     // inbound channels open now
};

// What the warm-connection keeper is doing (diagnostics, tests, the benchmark).
struct WarmStats {
  std::size_t wanted = 0;     // routing-table nodes in the warm set now
  std::size_t connected = 0;  // of those, with an open connection
  std::size_t dialing = 0;    // warm dials in flight
  std::uint64_t dials = 0, failed = 0;
  std::uint64_t checks = 0, recomputes = 0;  // keeper wake-ups, and those that recomputed the set
  std::size_t admitting = 0;                 // lookup-learned nodes waiting for an admission ping
  bool refreshing = false;                   // a refresh round runs (DhtConfig::refresh_splits)
  std::size_t table = 0;                     // routing-table nodes
  std::size_t connections = 0;               // the host's open connections
};

// One live value: the bytes, the remaining time-to-live when the get finished, and the
// writer's version stamp (microseconds since the Unix epoch on the writer's clock).
struct Value {
  Bytes value;
  Millis ttl{0};
  std::uint64_t version = 0;
  bool is_signed = false;
};

// What a get found. A key holds either a plain value or a dictionary (a non-empty dictionary
// is the key's value: see record.hpp).
struct Found {
  std::optional<Value> plain;
  std::map<SubKey, Value> dictionary;  // every live sub-key, newest value per sub-key
  std::size_t hops = 0;                // lookup hops to the first node that had it
  bool is_dictionary() const noexcept { return !dictionary.empty(); }
};

struct Stored {
  std::size_t replicas = 0;  // nodes holding the records now (this one included)
  std::size_t refused = 0;   // nodes that answered but kept something newer
};

class DhtNode : public std::enable_shared_from_this<DhtNode> {
 public:
  // `host` must be started (its listen addresses are announced) unless in client mode.
  static std::shared_ptr<DhtNode> create(std::shared_ptr<net::Host> host, DhtNodeConfig cfg = {});
  ~DhtNode();
  DhtNode(const DhtNode&) = delete;
  DhtNode& operator=(const DhtNode&) = delete;

  // Serves the protocol (server mode), starts the timers and, if `initial_peers` is not
  // empty, bootstraps through them. A node started with no peers is the first node of a
  // network (others bootstrap through it).
  awaitable<result<void>> start(std::vector<net::Multiaddr> initial_peers = {});
  // Joins through `initial_peers` (multiaddrs, with or without /p2p/<id>), retrying with
  // backoff; errc::unavailable "none of the N initial peers answered ..." if none ever does.
  awaitable<result<void>> bootstrap(std::vector<net::Multiaddr> initial_peers);
  // Stops serving, cancels requests in flight and fails waiting operations with
  // errc::cancelled; bounded by stop_timeout. The host is left running (its owner stops it).
  // A started node keeps itself alive (its timer task holds it) until stop() is called.
  awaitable<void> stop();

  // --- operations ---------------------------------------------------------------------------
  // A plain value under `key`, for `ttl` (expiry travels relative: see record.hpp).
  awaitable<result<Stored>> store(RecordKey key, Bytes value, Millis ttl);
  // One sub-key of the dictionary under `key`; other sub-keys (any writer's) are kept.
  awaitable<result<Stored>> store(RecordKey key, SubKey subkey, Bytes value, Millis ttl);
  // An owned record signed with this node's Ed25519 key: the key (if no sub-key) or the
  // sub-key must contain owner_marker() (see owned_key / owned_subkey).
  awaitable<result<Stored>> store_signed(RecordKey key, std::optional<SubKey> subkey, Bytes value,
                                         Millis ttl);
  // Prepared records (versions, signatures set by the caller).
  awaitable<result<Stored>> store_records(RecordKey key, std::vector<Record> records,
                                          StoreOptions options = {});
  // Everything live under `key`; std::nullopt if no node has it. `latest`: see GetOptions.
  awaitable<result<std::optional<Found>>> get(RecordKey key, bool latest = false);
  // The k closest live nodes to `target`.
  awaitable<result<std::vector<Contact>>> find_node(DhtId target);

  // --- owned records ------------------------------------------------------------------------
  std::string owner_marker() const;                  // "[owner:<this peer id>]"
  RecordKey owned_key(std::string_view name) const;  // name + owner_marker()
  SubKey owned_subkey(std::string_view name) const;  // name + owner_marker()

  // --- state (on the executor) --------------------------------------------------------------
  const net::PeerId& peer() const noexcept { return host_->local_peer(); }
  net::Host& host() noexcept { return *host_; }
  asio::any_io_executor executor() { return host_->get_executor(); }
  const DhtCore& core() const noexcept { return core_; }
  const DhtNodeConfig& config() const noexcept { return cfg_; }
  bool client_mode() const noexcept { return cfg_.dht.client_mode; }
  bool running() const noexcept { return started_ && !stopping_; }
  // Addresses announced to peers (binary multiaddrs as the core sends them, as text here).
  std::vector<net::Multiaddr> announced() const;
  // Re-reads announced() into what the node sends (called when the host's addresses change).
  void refresh_addresses();
  // AutoNAT's verdict (collab::TrainingNode feeds it): a node configured as
  // a server runs in client mode while it is not publicly reachable (its requests tell peers
  // to keep it out of their routing tables; it announces no addresses and stores no replicas)
  // and as a server again once reachable. It keeps answering requests that reach it. No
  // effect on a node configured in client mode.
  void set_reachable(bool reachable);
  // Feeds each conclusive verdict of `autonat` to set_reachable() (`starling dht`, TrainingNode).
  void follow(net::AutonatClient& autonat);
  std::uint64_t bad_messages() const noexcept { return bad_messages_; }
  WarmStats warm_stats() const;
  ChannelStats channel_stats() const;

 private:
  struct Waiter;
  struct Channel;
  DhtNode(std::shared_ptr<net::Host> host, DhtNodeConfig cfg);

  Now now() const { return Now::from_clocks(); }
  // Sends what the core wants sent, hands out results, re-arms the timer.
  void pump();
  std::shared_ptr<Waiter> add_waiter(OpId id);
  awaitable<OpResult> wait_op(OpId id, std::shared_ptr<Waiter> w);
  awaitable<OpResult> run_store(RecordKey key, std::vector<Record> records, StoreOptions options);
  awaitable<void> send_request(OutgoingRequest out);
  awaitable<void> timer_loop();
  result<Bytes> serve(const net::PeerId& from, BytesView request);
  static awaitable<result<google::protobuf::BytesValue>> serve_entry(std::weak_ptr<DhtNode> self,
                                                                     net::PeerId from,
                                                                     std::string request);
  // Request channels (node_channel.cpp).
  bool channel_send(OutgoingRequest& out);
  std::shared_ptr<Channel> open_channel(const net::PeerId& peer, const OutgoingRequest& first);
  void channel_failed(const std::shared_ptr<Channel>& ch, const Error& e, bool error = true);
  awaitable<void> channel_writer(std::shared_ptr<Channel> ch, Duration open_timeout);
  awaitable<void> channel_reader(std::shared_ptr<Channel> ch);
  awaitable<void> channel_sweeper();
  void sweep_channels();
  void close_channels();
  static awaitable<void> serve_channel(std::weak_ptr<DhtNode> weak, net::ByteStreamPtr s,
                                       net::PeerId from);
  awaitable<result<std::vector<Contact>>> seeds_of(const std::vector<net::Multiaddr>& addrs);
  // Warm connections (node_warm.cpp).
  std::vector<Contact> warm_candidates() const;
  bool warm_due() const;
  void refresh_warm();
  void update_admission();
  awaitable<void> warm_dial(Contact c);
  static awaitable<void> warm_loop(std::shared_ptr<DhtNode> self);

  std::shared_ptr<net::Host> host_;
  DhtNodeConfig cfg_;
  DhtCore core_;
  net::RpcClient client_;
  std::unique_ptr<net::RpcServer> server_;
  TaskScope scope_;
  Timer timer_;
  std::unordered_map<std::uint64_t, std::shared_ptr<Waiter>> waiters_;
  bool started_ = false, stopping_ = false;
  bool configured_client_ = false;  // cfg_.dht.client_mode as created (set_reachable)
  std::uint64_t bad_messages_ = 0;
  std::set<net::PeerId> warm_kept_, warm_dialing_;
  std::map<net::PeerId, TimePoint> warm_retry_at_;
  std::uint64_t warm_dials_ = 0, warm_failed_ = 0, warm_checks_ = 0, warm_recomputes_ = 0;
  std::uint64_t warm_version_ = ~std::uint64_t{0};  // routing-table version of the last recompute
  bool warm_dirty_ = true;                          // a disconnect since the last recompute
  TimePoint warm_next_retry_ = TimePoint::max();    // earliest retry of a failed warm peer
  std::unordered_map<net::PeerId, std::shared_ptr<Channel>> channels_;
  std::set<net::PeerId> channel_legacy_;  // peers that answered "na" to the channel protocol
  std::map<net::PeerId, std::size_t> inbound_per_peer_;
  std::set<net::ByteStreamPtr> inbound_channels_;
  ChannelStats channel_stats_;
};

// Blocking facade for threads other than the node's io thread (training loops, tools): each
// call runs the coroutine on the node's executor through block_on() and waits, bounded by
// the operation timeout plus `grace`.
class BlockingDhtNode {
 public:
  explicit BlockingDhtNode(std::shared_ptr<DhtNode> node) : node_(std::move(node)) {}
  Duration grace = 5s;

  result<void> bootstrap(std::vector<net::Multiaddr> initial_peers);
  result<Stored> store(RecordKey key, Bytes value, Millis ttl);
  result<Stored> store(RecordKey key, SubKey subkey, Bytes value, Millis ttl);
  result<Stored> store_signed(RecordKey key, std::optional<SubKey> subkey, Bytes value, Millis ttl);
  result<std::optional<Found>> get(RecordKey key, bool latest = false);
  DhtNode& node() noexcept { return *node_; }

 private:
  Duration bound() const { return node_->config().dht.operation_timeout + grace; }
  std::shared_ptr<DhtNode> node_;
};

}  // namespace starling::dht
