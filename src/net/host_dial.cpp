// Host: outbound dials, the connection registry, and connection-level events.
#include <asio/ip/tcp.hpp>

#include "host_internal.hpp"
#include "starling/core/log.hpp"
#include "starling/net/multistream.hpp"
#include "starling/net/noise.hpp"

namespace starling::net {

namespace {
Duration remaining(TimePoint deadline) {
  auto now = Clock::now();
  return deadline > now ? deadline - now : Duration::zero();
}
}  // namespace

std::shared_ptr<Host::Connection> Host::best_connection(const PeerId& peer) const {
  auto it = conns_.find(peer);
  if (it == conns_.end()) return nullptr;
  std::shared_ptr<Connection> relayed;
  for (auto& c : it->second)  // oldest live direct connection first, else a relayed one
    if (!c->closed && !c->session->closed()) {
      if (!c->relayed) return c;
      if (!relayed) relayed = c;
    }
  return relayed;
}

bool Host::is_connected(const PeerId& peer) const {
  return best_connection(peer) != nullptr;
}

std::vector<ConnectionInfo> Host::connections() const {
  std::vector<ConnectionInfo> out;
  for (auto& [p, v] : conns_)
    for (auto& c : v)
      if (!c->closed)
        out.push_back(
            {c->peer, c->remote_addr, c->outbound, c->session->stream_count(), c->relayed});
  return out;
}

std::shared_ptr<Host::Connection> Host::add_connection(std::shared_ptr<YamuxSession> session,
                                                       PeerId peer, Multiaddr remote, bool outbound,
                                                       bool relayed) {
  auto conn = std::make_shared<Connection>();
  conn->id = next_conn_id_++;
  conn->peer = peer;
  conn->remote_addr = remote;
  conn->outbound = outbound;
  conn->relayed = relayed;
  conn->session = session;
  conn->last_active = Clock::now();
  bool first = best_connection(peer) == nullptr;
  conns_[peer].push_back(conn);
  if (outbound)
    add_addresses(peer, {remote}, AddrSource::dialed);
  else if (peers_.count(peer))
    touch_peer(peer, /*met=*/true);  // else identify adds it
  std::weak_ptr<Host> weak = weak_from_this();
  auto id = conn->id;
  session->set_on_close([weak, id](const Error& why) {
    if (auto self = weak.lock()) self->remove_connection(id, why);
  });
  session->start();
  logger("net")->debug("{} connection to {} via {}", outbound ? "outbound" : "inbound",
                       peer.short_string(), remote.to_string());
  scope_.spawn(stream_accept_loop(conn));
  scope_.spawn(identify_peer(conn));
  // B of a relayed connection starts DCUtR at once, without waiting for identify (two
  // relayed RTTs: negotiation and answer): the lazy /libp2p/dcutr proposal travels with
  // CONNECT, and a peer that does not speak it refuses the stream (host_dcutr.cpp).
  if (relayed && !outbound) maybe_start_dcutr(conn);
  if (!on_conn_opened_.empty()) {
    const ConnectionInfo info{peer, remote, outbound, 0, relayed};
    for (auto& cb : on_conn_opened_) cb(info);
  }
  if (first)
    for (auto& cb : on_connected_) cb(peer);
  return conn;
}

void Host::remove_connection(std::uint64_t id, const Error& why) {
  for (auto it = conns_.begin(); it != conns_.end(); ++it) {
    auto& v = it->second;
    auto c = std::find_if(v.begin(), v.end(), [&](auto& x) { return x->id == id; });
    if (c == v.end()) continue;
    (*c)->closed = true;
    PeerId peer = it->first;
    logger("net")->debug("connection to {} closed: {}", peer.short_string(), why.message());
    v.erase(c);
    if (v.empty()) {
      conns_.erase(it);
      // Useful until now: the newest of the peers that may be forgotten.
      if (peers_.count(peer)) touch_peer(peer, /*met=*/true);
      for (auto& cb : on_disconnected_) cb(peer);
    }
    return;
  }
}

void Host::keep_alive(const PeerId& peer, bool on) {
  if (on) {
    keep_alive_.insert(peer);
    return;
  }
  if (keep_alive_.erase(peer) == 0) return;
  // The idle clock starts now, not at the connection's last stream long ago.
  if (auto it = conns_.find(peer); it != conns_.end())
    for (auto& c : it->second) c->last_active = Clock::now();
}

std::size_t Host::connection_count() const {
  std::size_t n = 0;
  for (auto& [p, v] : conns_) n += v.size();
  return n;
}

void Host::disconnect(const PeerId& peer) {
  auto it = conns_.find(peer);
  if (it == conns_.end()) return;
  for (auto& c : it->second) scope_.spawn(c->session->close());
}

// With lazy_select the proposal rides on the first bytes of the next layer (Noise's first
// handshake message; the first yamux frames), saving a round trip each; a refusal fails that
// layer's first read with errc::unsupported.
awaitable<result<ByteStreamPtr>> Host::select_one(ByteStreamPtr s, const char* protocol,
                                                  TimePoint deadline) {
  if (cfg_.lazy_select) co_return multistream_select_lazy(std::move(s), protocol);
  std::vector<std::string> protos{protocol};
  ST_CO_TRY(auto neg, co_await multistream_select(std::move(s), protos, remaining(deadline)));
  co_return neg.stream;
}

awaitable<result<std::shared_ptr<Host::Connection>>> Host::dial_addr(Multiaddr addr,
                                                                     std::optional<PeerId> expected,
                                                                     TimePoint deadline) {
  auto self = shared_from_this();
  auto what =
      "dial " + (expected ? expected->to_string() + " at " : std::string()) + addr.to_string();
  for (const auto& c : addr.components())
    if (c.proto == Proto::p2p_circuit) co_return co_await dial_circuit(addr, expected, deadline);
  auto op = [&]() -> awaitable<result<std::shared_ptr<Connection>>> {
    asio::ip::tcp::endpoint ep;
    if (auto dns = addr.dns_tcp()) {
      asio::ip::tcp::resolver resolver(ex_);
      auto [ec, results] =
          co_await resolver.async_resolve(dns->first, std::to_string(dns->second), use_nothrow);
      if (ec || results.empty()) co_return from_asio(ec, "resolve " + dns->first);
      ep = *results.begin();
    } else {
      ST_CO_TRY(ep, addr.to_tcp_endpoint());
    }
    ST_CO_TRY(auto tcp, co_await tcp_connect(ep, remaining(deadline)));
    tcp->set_write_timeout(cfg_.write_timeout);
    ByteStreamPtr raw = rate_limited(tcp, upload_limit_, download_limit_);
    ST_CO_TRY(auto up, co_await upgrade_outbound(raw, expected, deadline));
    ++stats_.outbound_connections;
    co_return add_connection(up.session, up.peer, addr.without_peer_id(), true);
  };
  auto r = co_await with_timeout(op(), remaining(deadline), what);
  if (!r) co_return r.error().with_context(what);
  co_return r;
}

awaitable<result<Host::Upgraded>> Host::upgrade_outbound(ByteStreamPtr raw,
                                                         std::optional<PeerId> expected,
                                                         TimePoint deadline) {
  ST_CO_TRY(auto sec, co_await select_one(raw, kNoiseProtocol, deadline));
  ST_CO_TRY(auto chan, co_await noise_secure_outbound(sec, key_, expected, remaining(deadline)));
  ST_CO_TRY(auto mux, co_await select_one(chan.stream, kYamuxProtocol, deadline));
  if (stopping_) co_return make_error(errc::cancelled, "host is stopping");
  co_return Upgraded{YamuxSession::create(mux, /*is_client=*/true, cfg_.yamux), chan.remote_peer};
}

awaitable<result<PeerId>> Host::dial_probe(const Multiaddr& addr, std::optional<PeerId> expected,
                                           Duration timeout) {
  auto self = shared_from_this();
  if (stopping_) co_return make_error(errc::cancelled, "host is stopping");
  ST_CO_TRY(auto conn,
            co_await dial_addr(addr.without_peer_id(), expected, Clock::now() + timeout));
  conn->closed = true;  // not handed out for streams
  scope_.spawn(conn->session->close());
  co_return conn->peer;
}

awaitable<result<std::shared_ptr<Host::Connection>>> Host::dial_peer(
    PeerId peer, TimePoint deadline, std::optional<Multiaddr> first) {
  std::vector<Multiaddr> addrs;
  if (first) addrs.push_back(first->without_peer_id());
  for (const auto& a : addr_book_.addrs(peer))
    if (addrs.empty() || a != addrs.front()) addrs.push_back(a);
  if (addrs.empty())
    co_return make_error(errc::not_found, "dial " + peer.to_string() + ": no known addresses");
  std::string errors;
  for (auto& a : addrs) {
    if (remaining(deadline) <= Duration::zero()) break;
    auto cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none) break;
    auto r = co_await dial_addr(a, peer, deadline);
    if (r) co_return r;
    errors += (errors.empty() ? "" : "; ") + r.error().message();
    if (r.error() == errc::cancelled) break;
  }
  if (auto cs = co_await asio::this_coro::cancellation_state;
      cs.cancelled() != asio::cancellation_type::none)
    co_return make_error(errc::cancelled, "dial " + peer.to_string() + " cancelled" +
                                              (errors.empty() ? "" : ": " + errors));
  if (errors.empty()) errors = "deadline passed before any address was tried";
  co_return make_error(errc::unavailable, "dial " + peer.to_string() + " failed: " + errors);
}

awaitable<result<std::shared_ptr<Host::Connection>>> Host::get_or_dial(
    const PeerId& peer, TimePoint deadline, std::optional<Multiaddr> first) {
  if (stopping_) co_return make_error(errc::cancelled, "host is stopping");
  if (peer == id_) co_return make_error(errc::invalid_argument, "cannot dial self");
  if (auto c = best_connection(peer)) co_return c;
  // Join a dial already in progress instead of opening a second connection. If that dial was
  // cancelled by its own caller (not by us), dial again ourselves.
  for (auto it = dialing_.find(peer); it != dialing_.end(); it = dialing_.find(peer)) {
    auto pending = it->second;
    ST_CO_TRY(co_await with_timeout(pending->done.wait(), remaining(deadline),
                                    "waiting for dial to " + peer.to_string()));
    if (pending->outcome || pending->outcome.error() != errc::cancelled || stopping_)
      co_return pending->outcome;
    if (auto c = best_connection(peer)) co_return c;
  }
  // Whatever ends this dial (result, cancellation, exception), joiners are woken and the
  // entry is removed: a stale entry would make the peer undialable for the Host's life.
  struct Finish {
    std::weak_ptr<Host> host;
    PeerId peer;
    std::shared_ptr<PendingDial> pending;
    ~Finish() {
      pending->done.set();
      auto h = host.lock();
      if (!h) return;
      if (auto it = h->dialing_.find(peer); it != h->dialing_.end() && it->second == pending)
        h->dialing_.erase(it);
    }
  } finish{weak_from_this(), peer, std::make_shared<PendingDial>(ex_)};
  finish.pending->outcome =
      make_error(errc::cancelled, "dial to " + peer.to_string() + " cancelled");
  dialing_[peer] = finish.pending;
  auto r = co_await dial_peer(peer, deadline, std::move(first));
  finish.pending->outcome = r;
  co_return r;
}

awaitable<result<PeerId>> Host::connect(const Multiaddr& addr, std::optional<Duration> timeout) {
  auto deadline = Clock::now() + timeout.value_or(cfg_.dial_timeout);
  auto expected = addr.peer_id();
  if (expected) {
    add_addresses(*expected, {addr});
    ST_CO_TRY(auto c, co_await get_or_dial(*expected, deadline, addr));
    co_return c->peer;
  }
  ST_CO_TRY(auto c, co_await dial_addr(addr, std::nullopt, deadline));
  co_return c->peer;
}

awaitable<result<void>> Host::connect(const PeerId& peer, std::optional<Duration> timeout) {
  auto deadline = Clock::now() + timeout.value_or(cfg_.dial_timeout);
  ST_CO_TRY(co_await get_or_dial(peer, deadline));
  co_return success();
}

}  // namespace starling::net
