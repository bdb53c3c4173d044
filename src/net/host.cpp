// Host lifecycle: creation, listening, accepting and upgrading inbound connections, stop().
#include <asio/ip/tcp.hpp>
#include <asio/ip/v6_only.hpp>

#include "host_internal.hpp"
#include "starling/core/log.hpp"
#include "starling/net/interfaces.hpp"
#include "starling/net/multistream.hpp"
#include "starling/net/noise.hpp"

namespace starling::net {
namespace {
constexpr Duration kPingIdle = 60s;          // a ping stream with no ping for this long ends
constexpr Duration kPingWrite = 10s;         // an echo the pinger does not read in this long
constexpr int kMaxPingsPerStream = 1 << 16;  // then the pinger opens a new stream
}  // namespace

std::shared_ptr<Host> Host::create(asio::any_io_executor ex, crypto::KeyPair key, HostConfig cfg) {
  return std::shared_ptr<Host>(new Host(std::move(ex), std::move(key), std::move(cfg)));
}

Host::Host(asio::any_io_executor ex, crypto::KeyPair key, HostConfig cfg)
    : ex_(ex),
      key_(std::move(key)),
      id_(PeerId::from_public_key(key_.public_key())),
      cfg_(std::move(cfg)),
      scope_(ex),
      addr_book_(cfg_.max_addrs_per_peer) {
  if (cfg_.max_upload_bytes_per_second > 0)
    upload_limit_ =
        std::make_shared<TokenBucket>(cfg_.max_upload_bytes_per_second, cfg_.bandwidth_burst_bytes);
  if (cfg_.max_download_bytes_per_second > 0)
    download_limit_ = std::make_shared<TokenBucket>(cfg_.max_download_bytes_per_second,
                                                    cfg_.bandwidth_burst_bytes);
}

Host::~Host() {
  for (auto& acc : acceptors_) {
    std::error_code ec;
    acc->close(ec);
  }
}

awaitable<result<void>> Host::start() {
  if (started_) co_return make_error(errc::already_exists, "host already started");
  started_ = true;
  auto self = shared_from_this();
  for (const auto& text : cfg_.listen) {
    ST_CO_TRY(auto ma, Multiaddr::parse(text));
    auto ep = ma.to_tcp_endpoint();
    if (!ep) co_return ep.error().with_context("listen on " + text);
    auto acc = std::make_shared<asio::ip::tcp::acceptor>(ex_);
    std::error_code ec;
    acc->open(ep.value().protocol(), ec);
    if (!ec && cfg_.hole_punching)
      set_reuse_port(*acc, ec);  // DCUtR dials leave from this port
    else if (!ec)
      acc->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec && ep.value().address().is_v6()) acc->set_option(asio::ip::v6_only(true), ec);
    if (!ec) acc->bind(ep.value(), ec);
    if (!ec) acc->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) co_return from_asio(ec, "listen on " + text);
    auto actual = endpoint_addr(acc->local_endpoint(ec));
    listen_addrs_.push_back(actual);
    acceptors_.push_back(acc);
    scope_.spawn(accept_loop(acc));
  }
  for (const auto& text : cfg_.announce) {
    ST_CO_TRY(auto ma, Multiaddr::parse(text));
    announce_.push_back(ma.without_peer_id());
  }
  if (cfg_.announce.empty()) announce_ = expand_unspecified(listen_addrs_, interface_addresses());
  set_stream_handler(kIdentifyProtocol, [w = weak_from_this()](ByteStreamPtr s, PeerId p) {
    auto self = w.lock();
    return self ? self->serve_identify(std::move(s), std::move(p))
                : []() -> awaitable<void> { co_return; }();
  });
  set_stream_handler(kIdentifyPushProtocol, [w = weak_from_this()](ByteStreamPtr s, PeerId p) {
    auto self = w.lock();
    return self ? self->serve_identify_push(std::move(s), std::move(p))
                : []() -> awaitable<void> { co_return; }();
  });
  set_stream_handler(kPingProtocol, [](ByteStreamPtr s, PeerId) -> awaitable<void> {
    // Every wait is bounded: a peer that stops sending, or stops reading our echoes, loses
    // the stream instead of holding it (and its window of unread bytes) forever.
    std::array<std::uint8_t, 32> buf;
    for (int pings = 0; pings < kMaxPingsPerStream; ++pings) {
      auto r = co_await with_timeout(read_exact(*s, buf), kPingIdle, "ping");
      if (!r && r.error() == errc::closed) {  // the pinger is done: a clean close
        (void)co_await with_timeout(s->close_write(), kPingWrite, "ping close");
        co_return;
      }
      if (!r) break;
      if (!co_await with_timeout(s->write(buf), kPingWrite, "ping echo")) break;
    }
    s->reset();
  });
  if (cfg_.hole_punching)
    set_stream_handler(std::string(kDcutrProtocol),
                       [w = weak_from_this()](ByteStreamPtr s, PeerId p) {
                         auto self = w.lock();
                         return self ? self->serve_dcutr(std::move(s), std::move(p))
                                     : []() -> awaitable<void> { co_return; }();
                       });
  scope_.spawn(idle_sweeper());
  co_return success();
}

std::vector<Multiaddr> Host::listen_addresses() const {
  std::vector<Multiaddr> out;
  for (auto& a : listen_addrs_) out.push_back(a.with_peer_id(id_));
  return out;
}

std::vector<Multiaddr> Host::announce_addresses() const {
  std::vector<Multiaddr> out;
  auto add = [&](const Multiaddr& a) {
    auto full = a.with_peer_id(id_);
    if (std::find(out.begin(), out.end(), full) == out.end()) out.push_back(full);
  };
  for (const auto& [src, v] : extra_addrs_)
    if (v.second)
      for (const auto& a : v.first) add(a);
  for (const auto& a : announce_) add(a);
  for (const auto& [src, v] : extra_addrs_)
    if (!v.second)
      for (const auto& a : v.first) add(a);
  return out;
}

void Host::set_extra_addresses(const std::string& source, std::vector<Multiaddr> addrs,
                               bool first) {
  auto before = announce_addresses();
  if (addrs.empty())
    extra_addrs_.erase(source);
  else
    extra_addrs_[source] = {std::move(addrs), first};
  if (announce_addresses() != before)
    for (auto& cb : on_addrs_changed_) cb();
}

std::vector<Multiaddr> Host::observed_addresses() const {
  std::map<Multiaddr, int, bool (*)(const Multiaddr&, const Multiaddr&)> count(
      [](const Multiaddr& a, const Multiaddr& b) { return a.to_bytes() < b.to_bytes(); });
  for (const auto& [peer, v] : conns_) {
    bool direct = false;
    for (const auto& c : v) direct = direct || (!c->closed && !c->relayed);
    auto it = peers_.find(peer);
    if (!direct || it == peers_.end() || !it->second.info.observed_addr) continue;
    const auto& ob = *it->second.info.observed_addr;
    if (ob.to_tcp_endpoint()) ++count[ob.without_peer_id()];
  }
  std::vector<std::pair<int, Multiaddr>> order;
  for (auto& [a, n] : count) order.emplace_back(n, a);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& x, const auto& y) { return x.first > y.first; });
  std::vector<Multiaddr> out;
  for (auto& [n, a] : order) out.push_back(a);
  return out;
}

std::optional<ConnectionInfo> Host::stream_connection(const ByteStream* stream) const {
  auto it = stream_conns_.find(stream);
  if (it == stream_conns_.end()) return std::nullopt;
  const auto& c = *it->second;
  return ConnectionInfo{c.peer, c.remote_addr, c.outbound, c.session->stream_count(), c.relayed};
}

awaitable<void> Host::accept_loop(std::shared_ptr<asio::ip::tcp::acceptor> acc) {
  auto self = shared_from_this();
  for (;;) {
    auto [ec, sock] = co_await acc->async_accept(use_nothrow);
    if (ec) {
      if (ec == asio::error::operation_aborted || stopping_) co_return;
      logger("net")->warn("accept failed: {}", ec.message());
      // Back off briefly (e.g. EMFILE) instead of spinning.
      if (!co_await sleep_for(50ms)) co_return;
      continue;
    }
    if (!admit_inbound()) {
      ++stats_.rejected_connections;
      std::error_code ignore;
      sock.close(ignore);
      continue;
    }
    tune_socket(sock);
    auto tcp = std::make_shared<TcpStream>(std::move(sock));
    tcp->set_write_timeout(cfg_.write_timeout);
    auto pending = std::make_shared<PendingInbound>();
    pending->id = next_pending_id_++;
    pending->started = Clock::now();
    pending->tcp = tcp;
    pending_inbound_[pending->id] = pending;
    // A peer's hole-punch dial that reached our listener instead of our own dial socket.
    std::shared_ptr<Punch> punch;
    if (auto it = punches_.find(tcp->remote_endpoint()); it != punches_.end()) punch = it->second;
    scope_.spawn(handle_inbound(std::move(tcp), std::move(pending), std::move(punch)));
  }
}

awaitable<void> Host::handle_inbound(std::shared_ptr<TcpStream> tcp,
                                     std::shared_ptr<PendingInbound> pending,
                                     std::shared_ptr<Punch> punch) {
  auto self = shared_from_this();
  struct Done {  // however the handshake ends, it stops counting as pending (or punching)
    Host& host;
    std::uint64_t id;
    std::shared_ptr<Punch> punch;
    ~Done() {
      host.pending_inbound_.erase(id);
      if (punch) {
        --punch->running;
        punch->changed.pulse();
      }
    }
  } done{*this, pending->id, punch};
  if (punch) ++punch->running;
  auto remote = endpoint_addr(tcp->remote_endpoint());
  ByteStreamPtr raw = rate_limited(tcp, upload_limit_, download_limit_);
  auto upgrade = [&]() -> awaitable<result<std::shared_ptr<Connection>>> {
    if (!punch) {
      ST_CO_TRY(auto up, co_await upgrade_inbound(raw, cfg_.dial_timeout));
      co_return add_connection(up.session, up.peer, remote, /*outbound=*/false);
    }
    // DCUtR: the connection takes the role agreed on the relayed connection (the peer that
    // dialed through the relay is the client), whichever socket called connect().
    auto expected = punch->peer;
    result<Upgraded> up = make_error(errc::internal, "punched upgrade");
    if (punch->as_client)
      up = co_await upgrade_outbound(raw, expected, Clock::now() + cfg_.dial_timeout);
    else
      up = co_await upgrade_inbound(raw, cfg_.dial_timeout, expected);
    if (!up) co_return up.error();
    if (up.value().peer != expected)
      co_return make_error(errc::protocol_violation,
                           "punched connection reached " + up.value().peer.short_string());
    ++stats_.punched_connections;
    co_return add_connection(up.value().session, up.value().peer, remote, punch->as_client);
  };
  auto r = co_await with_timeout(upgrade(), cfg_.dial_timeout,
                                 "inbound upgrade from " + remote.to_string());
  if (!r) {
    ++stats_.failed_handshakes;
    if (pending->evicted)
      logger("net")->debug("inbound handshake from {} evicted: {}", remote.to_string(),
                           r.error().message());
    else
      logger("net")->info("inbound connection from {} failed: {}", remote.to_string(),
                          r.error().message());
    tcp->reset();
    co_return;
  }
  ++stats_.inbound_connections;
}

awaitable<result<Host::Upgraded>> Host::upgrade_inbound(ByteStreamPtr raw, Duration timeout,
                                                        std::optional<PeerId> expected) {
  ST_CO_TRY(auto sec, co_await multistream_handle(
                          raw, [](std::string_view p) { return p == kNoiseProtocol; }, timeout));
  ST_CO_TRY(auto chan, co_await noise_secure_inbound(sec.stream, key_, timeout));
  if (expected && chan.remote_peer != *expected) {
    chan.stream->reset();
    co_return make_error(errc::protocol_violation, "the relay named " + expected->short_string() +
                                                       " but the peer is " +
                                                       chan.remote_peer.short_string());
  }
  ST_CO_TRY(auto mux,
            co_await multistream_handle(
                chan.stream, [](std::string_view p) { return p == kYamuxProtocol; }, timeout));
  co_return Upgraded{YamuxSession::create(mux.stream, /*is_client=*/false, cfg_.yamux),
                     chan.remote_peer};
}

awaitable<void> Host::stop() {
  // stop() must run to completion even when the caller was cancelled (Ctrl-C): clear the
  // cancellation state of this coroutine chain so the bounded cleanup below can await.
  co_await asio::this_coro::reset_cancellation_state();
  if (stopping_) co_return;
  stopping_ = true;
  auto self = shared_from_this();
  for (auto& acc : acceptors_) {
    std::error_code ec;
    acc->close(ec);
  }
  std::vector<std::shared_ptr<Connection>> all;
  for (auto& [p, v] : conns_)
    for (auto& c : v) all.push_back(c);
  // Close every session concurrently (each close is bounded by the yamux close timeout),
  // then cancel whatever handlers remain.
  TaskScope closing(ex_);
  for (auto& c : all) closing.spawn(c->session->close());
  (void)co_await closing.join(cfg_.shutdown_timeout / 2);
  (void)co_await closing.close(cfg_.shutdown_timeout / 4);
  auto r = co_await scope_.close(cfg_.shutdown_timeout / 4);
  if (!r) logger("net")->warn("host {} stop: {}", id_.short_string(), r.error().message());
  conns_.clear();
  for (auto& [p, w] : identify_waiters_) w->set();
}

void Host::set_stream_handler(std::string protocol, StreamHandler handler) {
  handlers_[std::move(protocol)] = std::move(handler);
}
void Host::remove_stream_handler(const std::string& protocol) {
  handlers_.erase(protocol);
}
std::vector<std::string> Host::protocols() const {
  std::vector<std::string> out;
  for (auto& [p, h] : handlers_) out.push_back(p);
  return out;
}

}  // namespace starling::net
