// Host: DCUtR (/libp2p/dcutr) over relayed connections, driving DcutrMachine (dcutr.hpp).
//
// B, the peer that accepted a relayed connection, opens the dcutr stream on it once identify
// shows that the peer speaks the protocol and we have an address to offer; A (the peer that
// dialed through the relay) serves the stream. Both sides dial every address the other
// offered from their listening port (SO_REUSEPORT), so the two dials meet as one TCP
// simultaneous-open connection through endpoint-independent NATs. Whichever way the TCP
// connection forms (our dial socket, or the peer's SYN accepted by our listener: a punch
// registers the peer's endpoints in punches_ and accept_loop routes them here), it is
// upgraded in the role agreed on the relayed connection: A is the multistream dialer, Noise
// initiator and yamux client, B the server. A failed attempt leaves the relayed connection as
// it was; B retries up to DcutrConfig::max_attempts times.
#include <fmt/format.h>

#include "host_internal.hpp"
#include "starling/core/log.hpp"
#include "starling/net/multistream.hpp"

namespace starling::net {

namespace {
Duration until(TimePoint t) {
  auto now = Clock::now();
  return t > now ? t - now : Duration::zero();
}
long long ms(Duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}
}  // namespace

std::shared_ptr<Host::Connection> Host::direct_connection(const PeerId& peer) const {
  auto c = best_connection(peer);  // prefers a direct one
  return c && !c->relayed ? c : nullptr;
}

std::vector<Multiaddr> Host::dcutr_own_addresses() const {
  std::vector<Multiaddr> out;
  // Observed addresses come from ordinary dials (ephemeral ports); hole-punch dials leave
  // from the listening port, which a port-preserving NAT maps to the same outside port.
  for (const auto& ob : observed_addresses()) {
    auto ep = ob.without_peer_id().to_tcp_endpoint();
    if (!ep) continue;
    for (const auto& l : listen_addrs_)
      if (auto lep = l.to_tcp_endpoint(); lep && lep.value().protocol() == ep.value().protocol())
        out.push_back(Multiaddr::from_tcp_endpoint({ep.value().address(), lep.value().port()}));
  }
  for (const auto& a : announce_addresses())
    if (!a.is_circuit()) out.push_back(a.without_peer_id());
  return dcutr_filter(out, cfg_.dcutr.allow_private);
}

// Called when B's relayed connection opens (before identify: the peer's protocols are
// unknown, the stream's lazy proposal finds out) and again after identify (when the first
// call had no address to offer yet). One upgrade per relayed connection.
void Host::maybe_start_dcutr(std::shared_ptr<Connection> conn) {
  if (!cfg_.hole_punching || stopping_ || !conn->relayed || conn->outbound || conn->closed ||
      conn->dcutr_tried)
    return;
  if (direct_connection(conn->peer) || dcutr_running_.count(conn->peer)) return;
  if (auto it = peers_.find(conn->peer); it != peers_.end() && it->second.info.identified) {
    const auto& protos = it->second.info.protocols;
    if (std::find(protos.begin(), protos.end(), kDcutrProtocol) == protos.end()) {
      logger("net")->debug("dcutr: {} does not speak {}", conn->peer.short_string(),
                           kDcutrProtocol);
      return;
    }
  }
  scope_.spawn(run_dcutr(std::move(conn)));
}

awaitable<void> Host::run_dcutr(std::shared_ptr<Connection> conn) {
  auto self = shared_from_this();
  const PeerId peer = conn->peer;
  if (!dcutr_running_.insert(peer).second) co_return;
  struct Running {
    Host& host;
    PeerId peer;
    ~Running() { host.dcutr_running_.erase(peer); }
  } running{*this, peer};
  auto ours = dcutr_own_addresses();
  if (ours.empty()) {
    logger("net")->debug("dcutr: no address to offer {}, staying relayed", peer.short_string());
    co_return;
  }
  conn->dcutr_tried = true;
  ++stats_.dcutr_started;
  auto raw = co_await conn->session->open_stream();
  if (!raw) {
    ++stats_.dcutr_failed;
    logger("net")->info("dcutr with {}: cannot open a stream: {}", peer.short_string(),
                        raw.error().message());
    co_return;
  }
  const auto deadline = Clock::now() + cfg_.dcutr.message_timeout;
  auto s = co_await select_one(raw.value(), kDcutrProtocol.data(), deadline);
  if (!s) {
    ++stats_.dcutr_failed;
    raw.value()->reset();
    logger("net")->info("dcutr with {}: {}", peer.short_string(), s.error().message());
    co_return;
  }
  logger("net")->debug("dcutr with {}: offering {} addresses", peer.short_string(), ours.size());
  DcutrMachine m(DcutrRole::initiator, std::move(ours), cfg_.dcutr);
  auto acts = m.start(Clock::now());
  co_await drive_dcutr(conn, s.value(), m, std::move(acts));
}

awaitable<void> Host::serve_dcutr(ByteStreamPtr stream, PeerId remote) {
  auto self = shared_from_this();
  auto it = stream_conns_.find(stream.get());
  if (it == stream_conns_.end()) {
    stream->reset();
    co_return;
  }
  auto conn = it->second;
  // A is the peer that dialed through the relay: DCUtR is refused on a direct connection and
  // on one we accepted (there we are B and open the stream ourselves).
  if (!conn->relayed || !conn->outbound) {
    logger("net")->info("dcutr from {} over {} connection refused, stream closed",
                        remote.short_string(), conn->relayed ? "an inbound relayed" : "a direct");
    stream->reset();
    co_return;
  }
  if (!dcutr_running_.insert(remote).second) {
    logger("net")->info("dcutr from {}: an exchange is already running, stream closed",
                        remote.short_string());
    stream->reset();
    co_return;
  }
  struct Running {
    Host& host;
    PeerId peer;
    ~Running() { host.dcutr_running_.erase(peer); }
  } running{*this, remote};
  ++stats_.dcutr_started;
  DcutrMachine m(DcutrRole::responder, dcutr_own_addresses(), cfg_.dcutr);
  auto acts = m.start(Clock::now());
  co_await drive_dcutr(conn, stream, m, std::move(acts));
}

awaitable<void> Host::drive_dcutr(std::shared_ptr<Connection> conn, ByteStreamPtr stream,
                                  DcutrMachine& m, std::vector<DcutrAction> acts) {
  auto self = shared_from_this();
  const PeerId peer = conn->peer;
  const bool as_client = dcutr_upgrade_as_client(m.role());
  const char* role = m.role() == DcutrRole::initiator ? "B" : "A";
  const auto started = Clock::now();
  // From the peer's CONNECT on, its addresses are registered (punches_): its SYN may reach
  // our listener before our own dial leaves (for A: even before SYNC arrives), and must then
  // be upgraded in our role.
  auto p = std::make_shared<Punch>(ex_);
  p->peer = peer;
  p->as_client = as_client;
  struct Registered {
    Host& host;
    std::shared_ptr<Punch> punch;
    std::vector<asio::ip::tcp::endpoint> eps;
    ~Registered() {
      for (const auto& e : eps)
        if (auto it = host.punches_.find(e); it != host.punches_.end() && it->second == punch)
          host.punches_.erase(it);
    }
  } reg{*this, p, {}};
  auto expect_from = [&](const std::vector<Multiaddr>& addrs) {
    for (const auto& a : dcutr_filter(addrs, cfg_.dcutr.allow_private))
      if (auto ep = a.without_peer_id().to_tcp_endpoint(); ep && !punches_.count(ep.value())) {
        punches_[ep.value()] = p;
        reg.eps.push_back(ep.value());
      }
  };
  BufferedReader reader(*stream);
  for (;;) {
    std::vector<DcutrAction> next;
    for (auto& a : acts) {
      switch (a.kind) {
        case DcutrAction::Kind::none:
          break;
        case DcutrAction::Kind::send: {
          auto frame = frame_hole_punch(a.message);
          auto w = co_await with_timeout(stream->write(frame), cfg_.dcutr.message_timeout,
                                         "dcutr write");
          if (!w) {
            ++stats_.dcutr_failed;
            logger("net")->info("dcutr with {} ({}): {}; staying relayed", peer.short_string(),
                                role, w.error().message());
            stream->reset();
            co_return;
          }
          break;
        }
        case DcutrAction::Kind::dial: {
          auto deadline = m.deadline().value_or(a.at + cfg_.dcutr.dial_timeout);
          bool ok = co_await punch(p, a.addrs, a.at, deadline);
          auto more = m.on_dial_result(ok, Clock::now());
          next.insert(next.end(), more.begin(), more.end());
          break;
        }
        case DcutrAction::Kind::succeeded:
          ++stats_.dcutr_succeeded;
          logger("net")->info(
              "dcutr with {} ({}): direct connection after {} ms (attempt {}{})",
              peer.short_string(), role, ms(Clock::now() - started), m.attempts(),
              m.last_rtt() ? fmt::format(", relayed rtt {} ms", ms(*m.last_rtt())) : std::string());
          (void)co_await with_timeout(stream->close_write(), 1s, "dcutr close");
          co_return;
        case DcutrAction::Kind::failed:
          ++stats_.dcutr_failed;
          logger("net")->info("dcutr with {} ({}): {}; staying relayed", peer.short_string(), role,
                              a.reason);
          stream->reset();
          co_return;
      }
    }
    if (!next.empty()) {
      acts = std::move(next);
      continue;
    }
    if (m.done()) co_return;
    auto dl = m.deadline();
    if (!dl) {  // the machine always waits with a deadline; never block without one
      ++stats_.dcutr_failed;
      stream->reset();
      co_return;
    }
    auto body = co_await with_timeout(reader.read_length_prefixed(kMaxHolePunchMessage), until(*dl),
                                      "dcutr read");
    if (!body) {
      if (body.error() == errc::timeout) {
        acts = m.on_timeout(std::max(Clock::now(), *dl));
        continue;
      }
      if (body.error() == errc::unsupported && m.role() == DcutrRole::initiator &&
          m.attempts() == 1 && m.state() == DcutrMachine::State::await_connect) {
        // Started before identify: the peer refused the lazy /libp2p/dcutr proposal.
        --stats_.dcutr_started;
        logger("net")->debug("dcutr: {} does not speak {}, staying relayed", peer.short_string(),
                             kDcutrProtocol);
        stream->reset();
        co_return;
      }
      ++stats_.dcutr_failed;
      logger("net")->info("dcutr with {} ({}): stream ended in state {}: {}; staying relayed",
                          peer.short_string(), role, dcutr_state_name(m.state()),
                          body.error().message());
      stream->reset();
      co_return;
    }
    auto msg = parse_hole_punch(body.value());
    if (!msg) {
      ++stats_.dcutr_failed;
      logger("net")->info("dcutr with {} ({}): {}, stream closed", peer.short_string(), role,
                          msg.error().message());
      stream->reset();
      co_return;
    }
    if (msg.value().type == HolePunchMsg::Type::connect) expect_from(msg.value().addrs);
    acts = m.on_message(msg.value(), Clock::now());
  }
}

awaitable<bool> Host::punch(std::shared_ptr<Punch> p, std::vector<Multiaddr> addrs, TimePoint at,
                            TimePoint deadline) {
  auto self = shared_from_this();
  const PeerId peer = p->peer;
  if (until(at) > Duration::zero() && !co_await sleep_for(until(at))) co_return false;
  TaskScope dials(ex_);
  for (const auto& a : addrs) {
    ++p->running;
    dials.spawn([self, p, a, deadline]() -> awaitable<void> {
      struct Done {
        Punch& p;
        ~Done() {
          --p.running;
          p.changed.pulse();
        }
      } done{*p};
      auto r = co_await self->dial_punched(a, p->peer, p->as_client, until(deadline));
      if (r)
        ++self->stats_.punched_connections;
      else
        logger("net")->debug("dcutr: dial {}: {}", a.to_string(), r.error().message());
    });
  }
  bool ok = false;
  for (;;) {
    if (direct_connection(peer)) {
      ok = true;
      break;
    }
    if (p->running == 0 || until(deadline) == Duration::zero() || stopping_) break;
    auto w = co_await with_timeout(p->changed.wait(), until(deadline), "hole punch");
    if (!w && w.error() == errc::cancelled) break;
  }
  // Dials still running (other addresses) are not needed any more: one connection is enough.
  (void)co_await dials.close(1s);
  co_return ok;
}

}  // namespace starling::net
