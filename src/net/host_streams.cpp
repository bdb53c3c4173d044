// Host: opening streams, dispatching inbound streams to handlers, idle connection sweeping.
#include "host_internal.hpp"
#include "starling/core/log.hpp"
#include "starling/net/multistream.hpp"

namespace starling::net {

awaitable<result<ByteStreamPtr>> Host::open_stream(const PeerId& peer, std::string protocol,
                                                   Duration timeout) {
  auto self = shared_from_this();
  auto deadline = Clock::now() + timeout;
  auto what = "open " + protocol + " stream to " + peer.to_string();
  auto op = [&]() -> awaitable<result<ByteStreamPtr>> {
    ST_CO_TRY(auto conn, co_await get_or_dial(peer, deadline));
    conn->last_active = Clock::now();
    ST_CO_TRY(auto raw, co_await conn->session->open_stream());
    // Lazy select: the proposal goes out with the first request bytes, no round trip here.
    if (cfg_.lazy_select) co_return multistream_select_lazy(raw, protocol);
    std::vector<std::string> protos{protocol};
    auto left = std::max<Duration>(deadline - Clock::now(), Duration::zero());
    ST_CO_TRY(auto neg, co_await multistream_select(raw, protos, left));
    conn->last_active = Clock::now();
    co_return neg.stream;
  };
  auto r = co_await with_timeout(op(), timeout, what);
  if (!r) co_return r.error().with_context(what);
  co_return r;
}

awaitable<void> Host::stream_accept_loop(std::shared_ptr<Connection> conn) {
  auto self = shared_from_this();
  for (;;) {
    auto s = co_await conn->session->accept_stream();
    if (!s) co_return;  // session ended
    conn->last_active = Clock::now();
    ++stats_.inbound_streams;
    scope_.spawn(handle_stream(conn, s.value()));
  }
}

awaitable<void> Host::handle_stream(std::shared_ptr<Connection> conn, ByteStreamPtr stream) {
  auto self = shared_from_this();
  auto neg = co_await multistream_handle(
      stream, [this](std::string_view p) { return handlers_.count(std::string(p)) > 0; },
      cfg_.negotiate_timeout);
  if (!neg) {
    ++stats_.rejected_streams;
    co_return;
  }
  auto it = handlers_.find(neg.value().protocol);
  if (it == handlers_.end()) {  // removed while negotiating
    neg.value().stream->reset();
    co_return;
  }
  auto handler = it->second;  // copy: the map may change while the handler runs
  const ByteStream* key = neg.value().stream.get();
  stream_conns_[key] = conn;
  struct Unmap {
    Host& host;
    const ByteStream* key;
    ~Unmap() { host.stream_conns_.erase(key); }
  } unmap{*this, key};
  try {
    co_await handler(neg.value().stream, conn->peer);
  } catch (const std::system_error& e) {
    if (e.code() != asio::error::operation_aborted)
      logger("net")->warn("handler for {} from {} failed: {}", neg.value().protocol,
                          conn->peer.short_string(), e.what());
    neg.value().stream->reset();
  } catch (const std::exception& e) {
    logger("net")->error("handler for {} from {} threw: {}", neg.value().protocol,
                         conn->peer.short_string(), e.what());
    neg.value().stream->reset();
  }
  conn->last_active = Clock::now();
}

awaitable<void> Host::idle_sweeper() {
  auto self = shared_from_this();
  auto period = std::max<Duration>(std::min<Duration>(cfg_.idle_timeout / 4, 10s), 10ms);
  for (;;) {
    if (!co_await sleep_for(period)) co_return;
    auto now = Clock::now();
    for (auto& [peer, v] : conns_)
      for (auto& c : v)
        // Only the dialer closes an idle connection: the listener may be the side that wants
        // it warm (the dialer's keep_alive), and each side closing on its own clock would
        // make a warm peer redial forever. Inbound connections are bounded by max_connections.
        if (!c->closed && c->outbound && c->session->stream_count() == 0 &&
            !keep_alive_.count(peer) && now - c->last_active > cfg_.idle_timeout) {
          logger("net")->debug("closing idle connection to {}", peer.short_string());
          c->closed = true;
          scope_.spawn(c->session->close());
        }
  }
}

}  // namespace starling::net
