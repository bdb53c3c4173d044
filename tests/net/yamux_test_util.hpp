// Helpers for the yamux tests: session pairs over loopback TCP, deterministic payloads,
// hand-encoded frames (built from the spec's layout, not from the code under test), and a
// delaying TCP proxy that adds latency in-process (the kernel here has no netem).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>

#include "starling/core/async.hpp"
#include "starling/net/yamux.hpp"
#include "support/tcp_pair.hpp"

namespace starling::test {

// Deterministic pseudo-random bytes (xorshift32) so a receiver can check what it got.
inline Bytes pattern(std::size_t n, std::uint32_t seed) {
  Bytes b(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b[i] = static_cast<std::uint8_t>(x >> 24);
  }
  return b;
}

// Reads until the stream reports errc::closed; other errors are returned.
inline awaitable<result<Bytes>> read_all(net::ByteStream& s, std::size_t chunk = 64 * 1024) {
  Bytes out;
  Bytes buf(chunk);
  for (;;) {
    auto n = co_await s.read_some(buf);
    if (!n) {
      if (n.error() == errc::closed) co_return out;
      co_return n.error();
    }
    out.insert(out.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n.value()));
  }
}

// Writes `data` in pieces of `chunk` bytes.
inline awaitable<result<void>> write_chunked(net::ByteStream& s, BytesView data,
                                             std::size_t chunk) {
  for (std::size_t off = 0; off < data.size(); off += chunk) {
    ST_CO_TRY(co_await s.write(data.subspan(off, std::min(chunk, data.size() - off))));
  }
  co_return success();
}

struct SessionPair {
  std::shared_ptr<net::TcpStream> client_tcp, server_tcp;
  std::shared_ptr<net::YamuxSession> client, server;
};

inline SessionPair session_pair(asio::io_context& io, net::YamuxConfig client_cfg = {},
                                net::YamuxConfig server_cfg = {}) {
  auto [a, b] = tcp_pair(io);
  SessionPair p;
  p.client_tcp = a;
  p.server_tcp = b;
  p.client = net::YamuxSession::create(a, true, client_cfg);
  p.server = net::YamuxSession::create(b, false, server_cfg);
  p.client->start();
  p.server->start();
  return p;
}

// A yamux frame header encoded by hand from the spec: version 0, type, flags, stream id,
// length, all big-endian.
inline Bytes raw_frame(std::uint8_t type, std::uint16_t flags, std::uint32_t id,
                       std::uint32_t length, BytesView payload = {}, std::uint8_t version = 0) {
  Bytes b(12 + payload.size());
  b[0] = version;
  b[1] = type;
  b[2] = static_cast<std::uint8_t>(flags >> 8);
  b[3] = static_cast<std::uint8_t>(flags);
  for (int i = 0; i < 4; ++i) {
    b[4 + i] = static_cast<std::uint8_t>(id >> (24 - 8 * i));
    b[8 + i] = static_cast<std::uint8_t>(length >> (24 - 8 * i));
  }
  std::copy(payload.begin(), payload.end(), b.begin() + 12);
  return b;
}

struct RawHeader {
  std::uint8_t version, type;
  std::uint16_t flags;
  std::uint32_t id, length;
};

// Reads frames from a raw peer connection until one of `type` arrives (payloads of data
// frames skipped). errc::closed if the connection ends first.
inline awaitable<result<RawHeader>> read_raw_until(net::ByteStream& s, std::uint8_t type) {
  for (;;) {
    std::uint8_t h[12];
    ST_CO_TRY(co_await net::read_exact(s, MutableBytesView(h, 12)));
    RawHeader r{h[0], h[1], static_cast<std::uint16_t>(h[2] << 8 | h[3]), load_be32(h + 4),
                load_be32(h + 8)};
    if (r.type == type) co_return r;
    if (r.type == 0 && r.length > 0) {
      Bytes skip(r.length);
      ST_CO_TRY(co_await net::read_exact(s, skip));
    }
  }
}

// Forwards bytes between two TCP connections, delaying each direction by `delay`.
// Test-only stand-in for netem. Runs until either side closes.
class DelayProxy : public std::enable_shared_from_this<DelayProxy> {
 public:
  // Returns {client end, server end}: what the client and server sessions should use.
  static std::pair<std::shared_ptr<net::TcpStream>, std::shared_ptr<net::TcpStream>> create(
      asio::io_context& io, Duration delay) {
    auto [c, p1] = tcp_pair(io);
    auto [p2, s] = tcp_pair(io);
    auto proxy = std::shared_ptr<DelayProxy>(new DelayProxy(io, delay, p1, p2));
    asio::co_spawn(io, pump(proxy, p1, p2), asio::detached);
    asio::co_spawn(io, pump(proxy, p2, p1), asio::detached);
    return {c, s};
  }

 private:
  DelayProxy(asio::io_context& io, Duration delay, std::shared_ptr<net::TcpStream> a,
             std::shared_ptr<net::TcpStream> b)
      : delay_(delay), a_(std::move(a)), b_(std::move(b)) {}

  struct Chunk {
    TimePoint due;
    Bytes data;
  };
  struct Pipe {
    explicit Pipe(asio::any_io_executor ex) : ready(ex) {}
    std::deque<Chunk> q;
    AsyncEvent ready;
    bool eof = false;
  };

  static awaitable<void> pump(std::shared_ptr<DelayProxy> self,
                              std::shared_ptr<net::TcpStream> from,
                              std::shared_ptr<net::TcpStream> to) {
    auto pipe = std::make_shared<Pipe>(co_await asio::this_coro::executor);
    asio::co_spawn(co_await asio::this_coro::executor, deliver(self, pipe, from, to),
                   asio::detached);
    for (;;) {
      Bytes buf(256 * 1024);
      auto n = co_await from->read_some(buf);
      if (!n) break;
      buf.resize(n.value());
      pipe->q.push_back(Chunk{Clock::now() + self->delay_, std::move(buf)});
      pipe->ready.set();
    }
    pipe->eof = true;
    pipe->ready.set();
  }

  static awaitable<void> deliver(std::shared_ptr<DelayProxy> self, std::shared_ptr<Pipe> pipe,
                                 std::shared_ptr<net::TcpStream> from,
                                 std::shared_ptr<net::TcpStream> to) {
    Timer timer(co_await asio::this_coro::executor);
    for (;;) {
      if (pipe->q.empty()) {
        if (pipe->eof) break;
        pipe->ready.reset();
        if (!co_await pipe->ready.wait()) break;
        continue;
      }
      timer.expires_at(pipe->q.front().due);
      co_await timer.async_wait(use_nothrow);
      Chunk c = std::move(pipe->q.front());
      pipe->q.pop_front();
      if (!co_await to->write(c.data)) {
        from->reset();
        co_return;
      }
    }
    (void)co_await to->close_write();
  }

  Duration delay_;
  std::shared_ptr<net::TcpStream> a_, b_;
};

}  // namespace starling::test
