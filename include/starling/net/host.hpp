// Host: a libp2p node. Listens on TCP, dials peers, upgrades every connection
// (multistream-select -> Noise XX -> multistream-select -> yamux), keeps one live connection
// per peer and reuses it, routes inbound streams to protocol handlers, and runs identify and
// ping. Implements StreamHost for the protocols above it.
//
// Threading rule: a Host lives on one executor (one io_context thread); call its coroutines
// from that executor only. Blocking callers use core/blocking.hpp.
// Invariants: every dial, handshake and negotiation has a deadline; stop() completes within
// HostConfig::shutdown_timeout even with streams in flight; a misbehaving peer only ever
// loses its own connection.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <asio/ip/tcp.hpp>

#include "starling/crypto/keys.hpp"
#include "starling/net/address_book.hpp"
#include "starling/net/dcutr.hpp"
#include "starling/net/log_throttle.hpp"
#include "starling/net/multiaddr.hpp"
#include "starling/net/stream_host.hpp"
#include "starling/net/yamux.hpp"

namespace starling::net {

class TokenBucket;  // tcp.hpp

inline constexpr std::size_t kMaxKnownPeers = 4096;

struct HostConfig {
  // Addresses to listen on; port 0 picks a free port (listen_addresses() reports it).
  std::vector<std::string> listen = {"/ip4/127.0.0.1/tcp/0"};
  // Addresses announced to peers (identify, and what announce_addresses() returns) instead of
  // the listen addresses; empty: the listen addresses, with 0.0.0.0 / :: replaced by the
  // interface addresses (interfaces.hpp).
  std::vector<std::string> announce;
  Duration dial_timeout = 10s;       // TCP connect + security + muxer, per address
  Duration negotiate_timeout = 10s;  // multistream-select on a new stream
  // Dialer-side multistream-select is lazy (multistream.hpp): open_stream() returns at once
  // and the protocol proposal travels with the first bytes written, saving a round trip per
  // stream (and one each for /noise and /yamux when dialling); a refusal shows as
  // errc::unsupported on the stream's first read (or a write past kLazyOptimisticBytes).
  // false: every negotiation waits for the listener's answer.
  bool lazy_select = true;
  // A connection we dialled with no streams for this long is closed, unless keep_alive() is
  // on for its peer. Inbound ones are left to their dialer (max_connections bounds them).
  Duration idle_timeout = 120s;
  // DCUtR hole punching: listeners set SO_REUSEPORT so that dial_punched() can dial from the
  // listening port. Off by default: with it, a second process of the same user can bind the
  // same fixed port without an error (the kernel then splits incoming connections).
  bool hole_punching = false;
  // DCUtR (/libp2p/dcutr, host_dcutr.cpp), with hole_punching on: the host serves the
  // protocol and, as the peer that accepted a relayed connection, starts the upgrade once
  // identify shows the peer speaks it and we have an address to offer (observed addresses
  // with our listening port, then announced direct ones; dcutr.allow_private admits private
  // ranges, for labs). The relayed connection stays as the fallback.
  DcutrConfig dcutr;
  std::size_t max_connections = 1024;
  std::size_t max_pending_inbound = 64;  // inbound connections still handshaking
  // Addresses remembered per peer (address_book.hpp: dialled ones first, then the peer's
  // own, then hearsay; most recently confirmed first). Dials try them in that order.
  std::size_t max_addrs_per_peer = kMaxAddrsPerPeer;
  // Peers remembered (addresses and identify info; host_peers.cpp), so hearsay (DHT answers,
  // addresses from identify, callers) cannot grow the table without bound. Past the cap the
  // least recently useful peer is forgotten (useful: added, identified, connected or
  // disconnected). Peers we had a connection with and hearsay-only peers each keep at least
  // half the table when both compete: a flood of hearsay cannot push out the peers we met,
  // nor can they crowd out the hearsay a lookup is about to dial. Never forgotten: a peer
  // with an open connection, one being dialled, one kept alive (those stay even above the
  // cap, so the table holds at most max_known_peers plus them). Evictions are logged at most
  // once a minute with the count. A row with a full address book (16) takes ~9 KiB of heap
  // (host_peers_test), so 4096 such peers hold ~36 MiB; identify's protocol lists add to it.
  std::size_t max_known_peers = kMaxKnownPeers;
  // At a limit, an inbound connection is admitted by evicting (oldest first) a handshake
  // that has run longer than this, or else an inbound connection without streams that has
  // been idle this long and is not kept alive; only then is it refused. So a flood of idle
  // TCP connects (or of idle connections) cannot lock real peers out.
  Duration pending_inbound_grace = 1s;
  Duration shutdown_timeout = 5s;  // bound for stop()
  // A write to a connection that makes no progress for this long (the peer stopped reading)
  // fails with errc::timeout and closes the connection (0: no bound; tcp.hpp).
  Duration write_timeout = 30s;
  std::string agent_version = "starling/0.1.0";
  // Bandwidth limits for the whole host, in bytes per second (0 = unlimited): every
  // connection's raw TCP bytes (handshakes, every protocol, both directions counted
  // separately) share one token bucket per direction, with bursts of up to
  // bandwidth_burst_bytes (0 = max(16 KiB, 100 ms worth of the rate)).
  std::uint64_t max_upload_bytes_per_second = 0;
  std::uint64_t max_download_bytes_per_second = 0;
  std::uint64_t bandwidth_burst_bytes = 0;
  YamuxConfig yamux;
};

// What the host knows about a peer (from identify and from callers).
struct PeerInfo {
  std::vector<Multiaddr> addrs;  // best first, at most HostConfig::max_addrs_per_peer
  std::vector<std::string> protocols;
  std::string agent_version;
  std::string protocol_version;
  std::optional<Multiaddr> observed_addr;  // how the peer sees us
  bool identified = false;
};

struct ConnectionInfo {
  PeerId peer;
  Multiaddr remote_addr;
  bool outbound = false;
  std::size_t streams = 0;
  bool relayed = false;  // runs over a circuit relay stream (/p2p-circuit)
};

class Host final : public StreamHost, public std::enable_shared_from_this<Host> {
 public:
  static std::shared_ptr<Host> create(asio::any_io_executor ex, crypto::KeyPair key,
                                      HostConfig cfg = {});
  ~Host() override;

  // Binds every configured listen address. Errors name the address.
  awaitable<result<void>> start();
  // Closes listeners and connections, cancels handlers; bounded by shutdown_timeout.
  awaitable<void> stop();

  // Actual listen addresses (port resolved), each with /p2p/<id>.
  std::vector<Multiaddr> listen_addresses() const;
  // Addresses others can dial, each with /p2p/<id>: HostConfig::announce, or the listen
  // addresses with unspecified ones expanded to the interface addresses (non-loopback first,
  // loopback last), then the addresses added by set_extra_addresses() (confirmed public
  // addresses, /p2p-circuit addresses of relay reservations). What identify announces.
  std::vector<Multiaddr> announce_addresses() const;
  // Sets the extra announced addresses of one source ("autonat", "relay"); `first`: put them
  // before the direct addresses (a private node's relay addresses).
  void set_extra_addresses(const std::string& source, std::vector<Multiaddr> addrs,
                           bool first = false);
  // Our addresses as connected peers observed them (identify's observedAddr), the one most
  // peers reported first. Observations through relayed connections are left out.
  std::vector<Multiaddr> observed_addresses() const;
  // The connection an inbound stream arrived on, while its handler runs (its remote address
  // is the requester's observed address; `relayed` tells a circuit connection).
  std::optional<ConnectionInfo> stream_connection(const ByteStream* stream) const;
  // Dials `addr` on a new connection even if one to the peer exists (AutoNAT dial-back), and
  // closes it once it is up. Returns the peer that answered.
  awaitable<result<PeerId>> dial_probe(const Multiaddr& addr, std::optional<PeerId> expected,
                                       Duration timeout);
  // Runs the listener side of the connection upgrade (multistream /noise, Noise responder,
  // yamux server) over `stream` (a relayed one: circuit relay /stop) and registers the
  // connection as relayed with `remote` as its address. The authenticated peer must be
  // `expected` (else errc::protocol_violation: the relay lied about the peer).
  // DCUtR: dials `addr` from our listening port (SO_REUSEPORT; the two sides' dials meet as
  // one TCP simultaneous-open connection) and upgrades it as the client (`as_client`: the
  // peer that dialed through the relay) or the server (multistream listener, Noise responder,
  // yamux server) although our socket called connect(). The peer must be `expected`. The new
  // direct connection is preferred over the relayed one for new streams.
  awaitable<result<PeerId>> dial_punched(Multiaddr addr, PeerId expected, bool as_client,
                                         Duration timeout);
  awaitable<result<PeerId>> accept_relayed(ByteStreamPtr stream, Multiaddr remote, PeerId expected,
                                           Duration timeout);
  const PeerId& local_peer() const override { return id_; }
  const crypto::KeyPair& key() const { return key_; }
  asio::any_io_executor get_executor() override { return ex_; }

  // Remembers addresses for a peer (used by open_stream/connect by id), as hearsay unless
  // `source` says the peer itself or a dial confirmed them; at most max_addrs_per_peer stay.
  void add_addresses(const PeerId& peer, const std::vector<Multiaddr>& addrs,
                     AddrSource source = AddrSource::hearsay);
  // Connects to an address (with or without /p2p/<id>; without, any peer is accepted).
  // Reuses a live connection to the same peer. The address is tried first, then the peer's
  // known ones. Returns the peer's id.
  awaitable<result<PeerId>> connect(const Multiaddr& addr, std::optional<Duration> timeout = {});
  // Connects to a peer by id using known addresses.
  awaitable<result<void>> connect(const PeerId& peer, std::optional<Duration> timeout = {});
  // Closes every connection to `peer`.
  void disconnect(const PeerId& peer);
  // Keeps the connections to `peer` open while idle (the idle timeout skips them), for
  // protocols that want warm connections to chosen peers (the DHT's routing-table
  // neighbours). Off again: the idle timeout applies from the last activity.
  void keep_alive(const PeerId& peer, bool on);
  bool kept_alive(const PeerId& peer) const { return keep_alive_.count(peer) > 0; }
  std::size_t connection_count() const;
  // Peers in the table (peer_info() has them), at most max_known_peers plus protected ones.
  std::size_t known_peer_count() const { return peers_.size(); }

  awaitable<result<ByteStreamPtr>> open_stream(const PeerId& peer, std::string protocol,
                                               Duration timeout) override;
  void set_stream_handler(std::string protocol, StreamHandler handler) override;
  void remove_stream_handler(const std::string& protocol) override;
  std::vector<std::string> protocols() const;

  bool is_connected(const PeerId& peer) const;
  std::vector<ConnectionInfo> connections() const;
  std::optional<PeerInfo> peer_info(const PeerId& peer) const;
  // Waits until identify with `peer` completed (or timeout).
  awaitable<result<PeerInfo>> wait_identified(const PeerId& peer, Duration timeout);

  // Connection events (called on the host's executor).
  using PeerCallback = std::function<void(const PeerId&)>;
  void on_peer_connected(PeerCallback cb) { on_connected_.push_back(std::move(cb)); }
  void on_peer_disconnected(PeerCallback cb) { on_disconnected_.push_back(std::move(cb)); }
  // When announce_addresses() changed (relay reservations, AutoNAT).
  void on_addresses_changed(std::function<void()> cb) {
    on_addrs_changed_.push_back(std::move(cb));
  }
  // After each identify of a peer (its protocols and observed address are known).
  void on_peer_identified(PeerCallback cb) { on_identified_.push_back(std::move(cb)); }
  // Each new connection, relayed and direct ones, before streams run on it.
  void on_connection_opened(std::function<void(const ConnectionInfo&)> cb) {
    on_conn_opened_.push_back(std::move(cb));
  }

  // Test/diagnostic counters.
  struct Stats {
    std::uint64_t inbound_connections = 0, outbound_connections = 0, rejected_connections = 0;
    std::uint64_t failed_handshakes = 0, inbound_streams = 0, rejected_streams = 0;
    std::uint64_t evicted_handshakes = 0;   // pending inbound handshakes closed to admit another
    std::uint64_t evicted_connections = 0;  // idle inbound connections closed to admit another
    std::uint64_t forgotten_peers = 0;      // peers dropped from the table at max_known_peers
    // DCUtR upgrades of relayed connections, either role: started, ended with a direct
    // connection, given up (the relayed connection kept); hole-punch TCP connections made
    // (our dial, or the peer's dial accepted by a listener).
    std::uint64_t dcutr_started = 0, dcutr_succeeded = 0, dcutr_failed = 0;
    std::uint64_t punched_connections = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  struct Connection;
  struct PendingDial;
  struct PendingInbound;
  struct Punch;
  // A row of the peer table: what we know, and its place in the eviction order.
  struct KnownPeer {
    PeerInfo info;
    bool met = false;        // we had a connection with it (else: hearsay only)
    std::uint64_t used = 0;  // last confirmed useful (larger: more recent)
  };
  Host(asio::any_io_executor ex, crypto::KeyPair key, HostConfig cfg);

  awaitable<void> accept_loop(std::shared_ptr<asio::ip::tcp::acceptor> acc);
  awaitable<void> handle_inbound(std::shared_ptr<class TcpStream> tcp,
                                 std::shared_ptr<PendingInbound> pending,
                                 std::shared_ptr<Punch> punch = nullptr);
  // Whether an inbound connection may be accepted now, evicting a stale handshake or an idle
  // inbound connection if a limit is reached (host_admit.cpp).
  bool admit_inbound();
  bool evict_pending_handshake(TimePoint now);
  bool evict_idle_inbound(TimePoint now);
  void log_refusal(std::size_t live);
  awaitable<result<std::shared_ptr<Connection>>> dial_peer(PeerId peer, TimePoint deadline,
                                                           std::optional<Multiaddr> first);
  awaitable<result<std::shared_ptr<Connection>>> dial_addr(Multiaddr addr,
                                                           std::optional<PeerId> expected,
                                                           TimePoint deadline);
  // /p2p-circuit dial through a relay (host_relay.cpp).
  awaitable<result<std::shared_ptr<Connection>>> dial_circuit(Multiaddr addr,
                                                              std::optional<PeerId> expected,
                                                              TimePoint deadline);
  struct Upgraded;
  awaitable<result<Upgraded>> upgrade_outbound(ByteStreamPtr raw, std::optional<PeerId> expected,
                                               TimePoint deadline);
  // `expected`: the Noise-authenticated peer must be this one (checked before the muxer).
  awaitable<result<Upgraded>> upgrade_inbound(ByteStreamPtr raw, Duration timeout,
                                              std::optional<PeerId> expected = std::nullopt);
  awaitable<result<ByteStreamPtr>> select_one(ByteStreamPtr s, const char* protocol,
                                              TimePoint deadline);
  awaitable<result<std::shared_ptr<Connection>>> get_or_dial(
      const PeerId& peer, TimePoint deadline, std::optional<Multiaddr> first = std::nullopt);
  std::shared_ptr<Connection> add_connection(std::shared_ptr<YamuxSession> session, PeerId peer,
                                             Multiaddr remote, bool outbound, bool relayed = false);
  void remove_connection(std::uint64_t id, const Error& why);
  std::shared_ptr<Connection> best_connection(const PeerId& peer) const;
  awaitable<void> stream_accept_loop(std::shared_ptr<Connection> conn);
  awaitable<void> handle_stream(std::shared_ptr<Connection> conn, ByteStreamPtr stream);
  awaitable<void> idle_sweeper();
  // identify
  awaitable<void> identify_peer(std::shared_ptr<Connection> conn);
  awaitable<void> serve_identify(ByteStreamPtr stream, PeerId remote);
  awaitable<void> serve_identify_push(ByteStreamPtr stream, PeerId remote);
  Bytes identify_message(const Multiaddr& observed) const;
  void apply_identify(const PeerId& peer, BytesView msg);
  // DCUtR (host_dcutr.cpp)
  void maybe_start_dcutr(std::shared_ptr<Connection> conn);
  std::vector<Multiaddr> dcutr_own_addresses() const;
  awaitable<void> run_dcutr(std::shared_ptr<Connection> conn);
  awaitable<void> serve_dcutr(ByteStreamPtr stream, PeerId remote);
  awaitable<void> drive_dcutr(std::shared_ptr<Connection> conn, ByteStreamPtr stream,
                              DcutrMachine& m, std::vector<DcutrAction> acts);
  // Dials every address in `addrs` from our listening port at `at`, and upgrades in the
  // DCUtR role; a connection from the peer that one of our listeners accepted (punches_)
  // counts too. True once a direct connection to the peer exists, false when every dial and
  // accepted attempt failed or `deadline` passed.
  awaitable<bool> punch(std::shared_ptr<Punch> p, std::vector<Multiaddr> addrs, TimePoint at,
                        TimePoint deadline);
  std::shared_ptr<Connection> direct_connection(const PeerId& peer)
      const;  // peer table (host_peers.cpp): creates or refreshes `peer`'s row as the most recently
  // useful (met: a connection confirmed it), then trims the table to max_known_peers; the
  // returned reference stays valid (only other rows are evicted).
  PeerInfo& touch_peer(const PeerId& peer, bool met);
  void trim_peers(const PeerId& keep);
  bool forget_oldest(std::map<std::uint64_t, PeerId>& order, const PeerId& keep);
  bool peer_pinned(const PeerId& peer) const;  // connected, being dialled or kept alive

  asio::any_io_executor ex_;
  crypto::KeyPair key_;
  PeerId id_;
  HostConfig cfg_;
  TaskScope scope_;
  bool started_ = false, stopping_ = false;
  std::vector<std::shared_ptr<asio::ip::tcp::acceptor>> acceptors_;
  std::vector<Multiaddr> listen_addrs_;
  std::map<PeerId, std::vector<std::shared_ptr<Connection>>> conns_;
  std::map<PeerId, std::shared_ptr<PendingDial>> dialing_;
  std::set<PeerId> keep_alive_;
  std::map<std::string, StreamHandler> handlers_;
  std::map<PeerId, KnownPeer> peers_;
  // peers_ in eviction order, least recently useful first, by kind
  std::map<std::uint64_t, PeerId> met_by_use_, unmet_by_use_;
  std::uint64_t next_use_ = 1;
  LogThrottle forget_log_{60s};  // peers forgotten at max_known_peers are logged this often
  AddressBook addr_book_;        // peers_[p].info.addrs mirrors addr_book_.addrs(p)
  std::map<PeerId, std::shared_ptr<AsyncEvent>> identify_waiters_;
  std::map<std::uint64_t, std::shared_ptr<PendingInbound>> pending_inbound_;  // by start order
  std::uint64_t next_pending_id_ = 1;
  LogThrottle refusal_log_{10s};  // refused inbound connections are logged at most this often
  std::uint64_t next_conn_id_ = 1;
  std::vector<PeerCallback> on_connected_, on_disconnected_, on_identified_;
  std::vector<std::function<void()>> on_addrs_changed_;
  std::vector<std::function<void(const ConnectionInfo&)>> on_conn_opened_;
  std::vector<Multiaddr> announce_;  // HostConfig::announce parsed, or expanded
  std::map<std::string, std::pair<std::vector<Multiaddr>, bool>> extra_addrs_;  // by source
  std::map<const ByteStream*, std::shared_ptr<Connection>> stream_conns_;       // handlers running
  std::set<PeerId> dcutr_running_;  // peers with a DCUtR exchange in progress (either role)
  // Hole punches in progress by the peer's remote endpoint: a connection our listener accepts
  // from one of them is upgraded in the punch's role with the punch's peer.
  std::map<asio::ip::tcp::endpoint, std::shared_ptr<Punch>> punches_;
  Stats stats_;
  std::shared_ptr<TokenBucket> upload_limit_, download_limit_;  // null: unlimited
};

inline constexpr const char* kIdentifyProtocol = "/ipfs/id/1.0.0";
inline constexpr const char* kIdentifyPushProtocol = "/ipfs/id/push/1.0.0";
inline constexpr const char* kPingProtocol = "/ipfs/ping/1.0.0";
inline constexpr const char* kNoiseProtocol = "/noise";
inline constexpr const char* kYamuxProtocol = "/yamux/1.0.0";
inline constexpr const char* kRelayHopProtocol = "/libp2p/circuit/relay/0.2.0/hop";
inline constexpr const char* kRelayStopProtocol = "/libp2p/circuit/relay/0.2.0/stop";

// Ping (libp2p ping 1.0.0: 32 random bytes echoed back). Serving is installed by the host.
// Sends `count` pings over one stream and returns each round-trip time.
awaitable<result<std::vector<Duration>>> ping(Host& host, const PeerId& peer, int count,
                                              Duration timeout);

}  // namespace starling::net
