// AutoNAT v1 (/libp2p/autonat/1.0.0, libp2p/specs autonat/autonat-v1.md): a node asks peers
// to dial it back and learns whether it is publicly reachable, with a confidence; the server
// side dials back only addresses at the requester's observed IP (so it cannot be used to make
// a node dial a third party), never serves over relayed connections, and is rate limited.
//
// Threading rule: as Host (one executor; call from coroutines on it). AutonatCore is a pure
// state machine (no I/O, no clock), usable anywhere.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "starling/core/async.hpp"
#include "starling/net/host.hpp"

namespace starling::net {

inline constexpr const char* kAutonatProtocol = "/libp2p/autonat/1.0.0";
inline constexpr std::size_t kMaxAutonatMessage = 4096;

enum class Reachability { unknown, public_, private_ };
const char* reachability_name(Reachability r);

// Dial-back answers folded into a reachability with a confidence (0..max_confidence): an
// answer that agrees raises it, one that disagrees lowers it, and flips the status only once
// it is 0. So one lying or flaky server cannot flip a confident status.
class AutonatCore {
 public:
  explicit AutonatCore(int max_confidence = 3) : max_(max_confidence) {}
  // `reachable`: a server dialled us back (OK) or could not (E_DIAL_ERROR). Refusals and
  // errors say nothing about reachability and are not recorded. True if the status changed.
  bool record(bool reachable);
  Reachability status() const { return status_; }
  int confidence() const { return confidence_; }
  bool confident() const { return status_ != Reachability::unknown && confidence_ >= max_; }

 private:
  int max_;
  Reachability status_ = Reachability::unknown;
  int confidence_ = 0;
};

// What a server answered (status per the spec's ResponseStatus).
struct AutonatAnswer {
  int status = 0;  // OK=0, E_DIAL_ERROR=100, E_DIAL_REFUSED=101, E_BAD_REQUEST=200, ...
  std::string text;
  std::optional<Multiaddr> addr;  // the address dialled back (OK)
};

// Decodes a length-prefix-free AutoNAT message into the DIAL request's peer id and addresses
// (server side) or the answer (client side); errc::invalid_argument when malformed.
struct AutonatDial {
  PeerId peer;
  std::vector<Multiaddr> addrs;  // unparsable entries dropped
};
result<AutonatDial> parse_autonat_dial(BytesView msg);
result<AutonatAnswer> parse_autonat_answer(BytesView msg);

struct AutonatServerConfig {
  Duration dial_timeout = 15s;   // the whole dial-back
  Duration read_timeout = 10s;   // reading the request
  std::size_t max_addrs = 16;    // addresses considered per request
  std::size_t max_dials = 4;     // addresses dialled per request
  Duration window = 60s;         // rate limits count requests over this window
  std::size_t max_per_peer = 3;  // dial-backs per requesting peer per window
  std::size_t max_total = 30;    // dial-backs per window in all
  // Dial back loopback/private addresses too (tests, LANs); the observed-IP rule holds anyway.
  bool allow_private = false;
};

class AutonatServer : public std::enable_shared_from_this<AutonatServer> {
 public:
  struct Stats {
    std::uint64_t requests = 0, dialed_ok = 0, dial_errors = 0, refused = 0, bad_requests = 0;
  };
  static std::shared_ptr<AutonatServer> start(std::shared_ptr<Host> host,
                                              AutonatServerConfig cfg = {});
  void stop();
  const Stats& stats() const { return stats_; }

 private:
  AutonatServer(std::shared_ptr<Host> host, AutonatServerConfig cfg);
  awaitable<void> serve(ByteStreamPtr s, PeerId remote);
  awaitable<AutonatAnswer> handle(const Bytes& msg, const PeerId& remote,
                                  const std::optional<ConnectionInfo>& conn);
  bool admit(const PeerId& remote, TimePoint now);

  std::shared_ptr<Host> host_;
  AutonatServerConfig cfg_;
  std::deque<std::pair<TimePoint, PeerId>> recent_;  // dial-backs in the window
  Stats stats_;
};

struct AutonatClientConfig {
  Duration timeout = 20s;         // one request (the server's dial-back included)
  Duration interval = 15min;      // re-check period once confident
  Duration retry_interval = 30s;  // re-check period while not confident
  std::size_t servers_per_round = 3;
  int max_confidence = 3;
};

class AutonatClient : public std::enable_shared_from_this<AutonatClient> {
 public:
  static std::shared_ptr<AutonatClient> start(std::shared_ptr<Host> host,
                                              AutonatClientConfig cfg = {});
  awaitable<void> stop();
  // Asks one server to dial us back (our direct announce and observed addresses) and records
  // a conclusive answer.
  awaitable<result<AutonatAnswer>> probe(const PeerId& server, Duration timeout);
  Reachability status() const { return core_.status(); }
  int confidence() const { return core_.confidence(); }
  // Called when the status changes.
  void on_change(std::function<void(Reachability)> cb) { on_change_.push_back(std::move(cb)); }
  // Waits until the status is `want` (or timeout).
  awaitable<result<void>> wait_status(Reachability want, Duration timeout);

 private:
  AutonatClient(std::shared_ptr<Host> host, AutonatClientConfig cfg);
  awaitable<void> loop();
  std::vector<Multiaddr> candidates() const;

  std::shared_ptr<Host> host_;
  AutonatClientConfig cfg_;
  AutonatCore core_;
  TaskScope scope_;
  AsyncEvent wake_;
  std::vector<std::function<void(Reachability)>> on_change_;
};

}  // namespace starling::net
