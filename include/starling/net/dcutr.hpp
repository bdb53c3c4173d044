// DCUtR, direct connection upgrade through relay (libp2p/specs relay/DCUtR.md), protocol id
// /libp2p/dcutr: the HolePunch message and an I/O-free state machine for both roles.
//
// Roles (spec): A dialed through the relay (outbound relayed connection); B accepted it
// (inbound relayed connection, the reservation holder). B opens the /libp2p/dcutr stream and
// sends CONNECT with its addresses, timing the exchange; A answers CONNECT with its own; B
// sends SYNC and dials after RTT/2; A dials as soon as SYNC arrives. The two TCP dials meet as
// one simultaneous-open connection, on which A is the client (multistream-select dialer,
// Noise initiator, yamux client) and B the server, although B's socket called connect().
// B makes up to kDcutrMaxAttempts attempts, each with a fresh CONNECT/SYNC and RTT.
//
// The state machine reads no clock and does no I/O: the host feeds it messages, dial
// results and the time, and carries out the returned actions (Host does, host_dcutr.cpp,
// when HostConfig::hole_punching is on).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "starling/core/bytes.hpp"
#include "starling/core/clock.hpp"
#include "starling/core/error.hpp"
#include "starling/net/multiaddr.hpp"

namespace starling::net {

inline constexpr std::string_view kDcutrProtocol = "/libp2p/dcutr";
// Largest HolePunch message accepted (the spec's 4 KiB).
inline constexpr std::size_t kMaxHolePunchMessage = 4096;
// Most addresses taken from one message (the rest are ignored).
inline constexpr std::size_t kMaxHolePunchAddrs = 32;
inline constexpr int kDcutrMaxAttempts = 3;

struct HolePunchMsg {
  enum class Type : int { connect = 100, sync = 300 };
  Type type = Type::connect;
  std::vector<Multiaddr> addrs;  // ObsAddrs
};

// The message body (without the length prefix) and its parser: malformed protobuf, a
// missing or unknown type, or more than kMaxHolePunchMessage bytes are errors. Addresses
// that do not parse as multiaddrs are skipped; at most kMaxHolePunchAddrs are kept.
Bytes encode_hole_punch(const HolePunchMsg& m);
result<HolePunchMsg> parse_hole_punch(BytesView body);
// Length-prefixed (unsigned varint) framing, as on the stream.
Bytes frame_hole_punch(const HolePunchMsg& m);

// Whether `addr` is worth a hole-punch dial: /ip4 or /ip6 + /tcp, not relayed, and a public
// IP unless `allow_private` (netlab and loopback tests use private ranges).
bool dcutr_dialable(const Multiaddr& addr, bool allow_private);
std::vector<Multiaddr> dcutr_filter(const std::vector<Multiaddr>& addrs, bool allow_private);

enum class DcutrRole {
  initiator,  // B: accepted the relayed connection; opens /libp2p/dcutr, sends CONNECT first
  responder,  // A: dialed through the relay; answers CONNECT, dials on SYNC
};
// The role on a relayed connection: inbound (we accepted it through the relay) -> initiator.
constexpr DcutrRole dcutr_role(bool relayed_inbound) {
  return relayed_inbound ? DcutrRole::initiator : DcutrRole::responder;
}
// Whether we act as the client (multistream dialer, Noise initiator, yamux client) of the
// punched connection's upgrade: A (the responder) is; B is the server.
constexpr bool dcutr_upgrade_as_client(DcutrRole r) {
  return r == DcutrRole::responder;
}

struct DcutrConfig {
  Duration message_timeout = 5s;  // waiting for the peer's CONNECT or SYNC
  Duration dial_timeout = 5s;     // one attempt's dials, simultaneous open included
  int max_attempts = kDcutrMaxAttempts;
  bool allow_private = false;  // see dcutr_filter
};

// What the host must do next.
struct DcutrAction {
  enum class Kind {
    none,
    send,  // write `message` (framed) on the dcutr stream
    dial,  // at `at`, dial every address in `addrs` (from the listening port)
    succeeded,
    failed,  // give up: keep the relayed connection; `reason` says why
  };
  Kind kind = Kind::none;
  HolePunchMsg message;
  TimePoint at{};
  std::vector<Multiaddr> addrs;
  std::string reason;
};

class DcutrMachine {
 public:
  enum class State {
    idle,           // initiator: before start(); responder: waiting for CONNECT
    await_connect,  // initiator: CONNECT sent, waiting for the peer's
    await_sync,     // responder: CONNECT answered, waiting for SYNC
    dialing,        // dials scheduled or running
    succeeded,
    failed,
  };
  DcutrMachine(DcutrRole role, std::vector<Multiaddr> our_addrs, DcutrConfig cfg = {});

  // Initiator only: the first (or, after a failure, the next) attempt's CONNECT.
  std::vector<DcutrAction> start(TimePoint now);
  // A message from the peer. Anything out of turn is a protocol error: `failed`.
  std::vector<DcutrAction> on_message(const HolePunchMsg& m, TimePoint now);
  // The attempt's dials ended (`ok`: a direct connection to the peer exists, from our dial
  // or accepted by the listener). A failure retries (initiator) until max_attempts.
  std::vector<DcutrAction> on_dial_result(bool ok, TimePoint now);
  // Call when now >= deadline(): a wait that ran out counts as a failed attempt.
  std::vector<DcutrAction> on_timeout(TimePoint now);

  State state() const { return state_; }
  DcutrRole role() const { return role_; }
  int attempts() const { return attempts_; }
  std::optional<Duration> last_rtt() const { return rtt_; }
  // When the current wait runs out (nullopt: nothing to wait for).
  std::optional<TimePoint> deadline() const;
  bool done() const { return state_ == State::succeeded || state_ == State::failed; }

 private:
  std::vector<DcutrAction> fail(std::string reason);
  std::vector<DcutrAction> attempt_failed(std::string reason, TimePoint now);
  std::vector<DcutrAction> send_connect(TimePoint now);

  DcutrRole role_;
  std::vector<Multiaddr> ours_, peer_addrs_;
  DcutrConfig cfg_;
  State state_ = State::idle;
  int attempts_ = 0;
  TimePoint sent_at_{}, wait_until_{};
  std::optional<Duration> rtt_;
};

std::string_view dcutr_state_name(DcutrMachine::State s);

}  // namespace starling::net
