// Circuit relay v2 (libp2p/specs relay/circuit-v2.md): the relay service (hop protocol, on
// public nodes), the relay client (reservations and the stop protocol, on private nodes) and
// the wire helpers both use. Dialing a /p2p-circuit multiaddr is Host::connect's job
// (host_relay.cpp): the end-to-end Noise session runs over the relayed stream, so a relay
// only ever sees ciphertext and cannot pose as either side.
//
// Threading rule: as Host (one executor; call from coroutines on it).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "starling/core/async.hpp"
#include "starling/crypto/keys.hpp"
#include "starling/net/host.hpp"
#include "starling/net/multiaddr.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::pb {
class RelayLimit;
}

namespace starling::net {

// Status codes (spec: enum Status).
enum class RelayStatus : int {
  ok = 100,
  reservation_refused = 200,
  resource_limit_exceeded = 201,
  permission_denied = 202,
  connection_failed = 203,
  no_reservation = 204,
  malformed_message = 400,
  unexpected_message = 401,
};
std::string_view relay_status_name(int status);

// Largest hop/stop message accepted (a reservation with 16 addresses and a voucher is ~1 KiB).
inline constexpr std::size_t kMaxRelayMessage = 4096;

// The reservation voucher (a signed envelope, domain "libp2p-relay-rsvp", payload type
// multicodec 0x0302).
struct RelayVoucher {
  PeerId relay, peer;
  std::uint64_t expiration = 0;  // UNIX seconds
};
Bytes seal_voucher(const crypto::KeyPair& relay_key, const RelayVoucher& v);
// Verifies the envelope's signature, domain and type; the signer must be the voucher's relay.
result<RelayVoucher> open_voucher(BytesView envelope);

// Limits of the relay service (defaults as go-libp2p's relay v2 resources). Counters in
// RelayService::Stats; src/net/README.md lists them.
struct RelayServiceConfig {
  Duration reservation_ttl = 1h;       // a reservation lasts this long unless refreshed
  std::size_t max_reservations = 128;  // in all
  std::size_t max_reservations_per_ip = 8;
  std::size_t max_circuits_per_peer = 16;  // open circuits with a peer at either end
  std::size_t max_circuits = 1024;         // open circuits in all
  Duration circuit_duration = 2min;        // a circuit is reset after this long (0: no limit)
  std::uint64_t circuit_data = 1 << 17;    // ... or after this many bytes one way (0: no limit)
  Duration connect_timeout = 30s;          // hop CONNECT: the target's stop answer
  Duration message_timeout = 10s;          // reading a request
  std::size_t buffer_size = 16 * 1024;     // relay copy buffer per direction
  // Addresses put in reservations (empty: the host's announce addresses).
  std::vector<Multiaddr> announce;
};

class RelayService : public std::enable_shared_from_this<RelayService> {
 public:
  struct Stats {
    std::uint64_t reservations_accepted = 0, reservations_refused = 0;
    std::uint64_t circuits_opened = 0, circuits_refused = 0, circuits_failed = 0;
    std::uint64_t circuits_limited = 0;  // reset at circuit_duration or circuit_data
    std::uint64_t malformed = 0;         // streams closed for a malformed message
    std::uint64_t bytes_relayed = 0;
  };
  // Installs the hop handler on `host`.
  static std::shared_ptr<RelayService> start(std::shared_ptr<Host> host,
                                             RelayServiceConfig cfg = {});
  // Removes the handler and resets every open circuit.
  awaitable<void> stop();
  const Stats& stats() const { return stats_; }
  std::size_t reservations() const { return reservations_.size(); }
  std::size_t circuits() const { return circuits_total_; }

 private:
  struct Reservation {
    TimePoint expire;
    std::string ip;
  };
  RelayService(std::shared_ptr<Host> host, RelayServiceConfig cfg);
  awaitable<void> serve_hop(ByteStreamPtr s, PeerId remote);
  awaitable<void> reserve(ByteStreamPtr s, const PeerId& remote, const ConnectionInfo& conn);
  awaitable<void> connect(ByteStreamPtr s, Bytes rest, const PeerId& remote, BytesView target);
  awaitable<void> pipe(ByteStreamPtr from, ByteStreamPtr to, std::shared_ptr<bool> limited);
  void count_circuit(const PeerId& p, int delta);
  void set_limit(pb::RelayLimit& lim) const;

  std::shared_ptr<Host> host_;
  RelayServiceConfig cfg_;
  TaskScope scope_;
  std::map<PeerId, Reservation> reservations_;
  std::map<PeerId, std::size_t> circuits_;
  std::size_t circuits_total_ = 0;
  bool stopped_ = false;
  Stats stats_;
};

struct RelayClientConfig {
  // Relays to hold reservations with (with /p2p/<id>); more are added with add_relay().
  std::vector<Multiaddr> relays;
  std::size_t want_reservations = 2;  // keep this many (when that many relays are known)
  Duration reserve_timeout = 15s;     // one RESERVE exchange, dial included
  Duration retry_interval = 10s;      // after a failed reservation, per relay
  Duration stop_timeout = 15s;        // a /stop exchange plus the upgrade over it
  // Every probe_interval each relay holding our reservation is pinged; one that does not
  // answer within probe_timeout has its connection closed (its reservation is dropped and
  // another relay is asked), so a relay that went silent without a reset (host frozen, link
  // cut) is noticed within ~probe_interval + probe_timeout instead of yamux keepalive's ~40 s.
  // 0: no probes.
  Duration probe_interval = 10s;
  Duration probe_timeout = 5s;
  // Put the /p2p-circuit addresses before the direct ones in announce_addresses().
  bool announce_first = false;
};

class RelayClient : public std::enable_shared_from_this<RelayClient> {
 public:
  struct Held {
    PeerId relay;
    std::uint64_t expire = 0;      // UNIX seconds
    std::uint64_t granted = 0;     // seconds the reservation had left when granted
    std::vector<Multiaddr> addrs;  // our /p2p-circuit addresses through it
    std::optional<RelayVoucher> voucher;
    std::uint32_t limit_duration = 0;  // seconds (0: none given)
    std::uint64_t limit_data = 0;
  };
  // Installs the stop handler and starts keeping reservations.
  static std::shared_ptr<RelayClient> start(std::shared_ptr<Host> host, RelayClientConfig cfg);
  awaitable<void> stop();
  void add_relay(const Multiaddr& addr);
  // One RESERVE with `relay` (connected or dialable); refreshes held reservations too.
  awaitable<result<Held>> reserve(const PeerId& relay, Duration timeout);
  std::vector<Held> reservations() const;
  // Waits until at least `n` reservations are held.
  awaitable<result<void>> wait_reservations(std::size_t n, Duration timeout);
  std::uint64_t refused_stops() const { return refused_stops_; }
  // Relays whose connection was closed because a probe got no answer.
  std::uint64_t silent_relays() const { return silent_relays_; }

 private:
  RelayClient(std::shared_ptr<Host> host, RelayClientConfig cfg);
  awaitable<void> serve_stop(ByteStreamPtr s, PeerId relay);
  awaitable<void> maintain();
  awaitable<void> probe_relays();
  void publish();

  std::shared_ptr<Host> host_;
  RelayClientConfig cfg_;
  TaskScope scope_;
  std::vector<PeerId> relays_;  // in preference order
  std::map<PeerId, Held> held_;
  std::map<PeerId, TimePoint> next_try_;
  AsyncEvent changed_;
  std::uint64_t refused_stops_ = 0;
  std::uint64_t silent_relays_ = 0;
};

}  // namespace starling::net
