// Implementation of the delaying TCP proxy (see proxy.hpp).
#include "proxy.hpp"

#include <linux/netfilter_ipv4.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

namespace netlab {
namespace {
// Bookkeeping cost charged per queued chunk against max_buffer, so a stream of tiny writes
// cannot pile up an unbounded number of chunks.
constexpr std::size_t kChunkOverhead = 128;
}  // namespace

// ---------------------------------------------------------------------------------------------
// StallSchedule

StallSchedule::StallSchedule(double every_ms, double stall_ms, std::uint64_t seed, TimePoint origin)
    : enabled_(every_ms > 0 && stall_ms > 0),
      stall_(ms(stall_ms)),
      every_ms_(every_ms),
      rng_(seed ^ 0x5354414c4cULL) {
  if (!enabled_) return;
  end_ = origin;
  next_window();
}

void StallSchedule::next_window() {
  // Gap between the end of one stall and the start of the next: uniform in [0.5, 1.5] x mean.
  std::uniform_real_distribution<double> gap(0.5 * every_ms_, 1.5 * every_ms_);
  start_ = end_ + ms(gap(rng_));
  end_ = start_ + stall_;
}

TimePoint StallSchedule::release_after(TimePoint t) {
  if (!enabled_) return t;
  while (t >= end_) {
    next_window();
    ++count_;
  }
  if (t >= start_) return end_;
  return t;
}

// ---------------------------------------------------------------------------------------------
// Direction

Direction::Direction(DirectionConfig cfg, std::uint64_t seed) : cfg_(cfg), rng_(seed) {}

TimePoint Direction::release_time(TimePoint now, TimePoint last) {
  double d = cfg_.delay_ms;
  if (cfg_.jitter_ms > 0) {
    std::uniform_real_distribution<double> j(-cfg_.jitter_ms, cfg_.jitter_ms);
    d += j(rng_);
  }
  if (d < 0) d = 0;
  if (delay_samples == 0 || d < delay_min_ms) delay_min_ms = d;
  if (delay_samples == 0 || d > delay_max_ms) delay_max_ms = d;
  ++delay_samples;
  return std::max(now + ms(d), last);
}

TimePoint Direction::reserve(std::size_t n, TimePoint now) {
  if (!paced()) return now;
  // Token bucket holding 10 ms of credit: a writer that woke up late (busy machine) may catch
  // up on up to 10 ms of lost time, and an idle link can burst that much.
  TimePoint start = std::max(next_free_, now - std::chrono::milliseconds(10));
  double secs = static_cast<double>(n) * 8.0 / (cfg_.rate_mbit * 1e6);
  next_free_ = start + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(secs));
  return std::max(start, now);
}

std::size_t Direction::piece_size() const {
  if (!paced()) return std::size_t{1} << 20;
  // About 5 ms worth of bytes per write, so pacing stays smooth at any rate.
  double bytes = cfg_.rate_mbit * 1e6 / 8.0 * 0.005;
  return static_cast<std::size_t>(std::clamp(bytes, 1400.0, 65536.0));
}

// ---------------------------------------------------------------------------------------------
// Connection

Connection::Connection(Proxy& proxy, tcp::socket client, std::uint64_t id)
    : proxy_(proxy),
      client_(std::move(client)),
      server_(client_.get_executor()),
      up_(client_.get_executor()),
      down_(client_.get_executor()),
      id_(id) {}

void Connection::start(tcp::endpoint target) {
  asio::co_spawn(client_.get_executor(), run(target), asio::detached);
}

void Connection::abort(bool rst) {
  if (aborted_) return;
  aborted_ = true;
  if (rst) {
    reset_socket(client_);
    reset_socket(server_);
  } else {
    close_socket(client_);
    close_socket(server_);
  }
  for (Pipe* p : {&up_, &down_}) {
    p->to_writer.set();
    p->to_reader.set();
    p->timer.cancel();
  }
}

awaitable<void> Connection::run(tcp::endpoint target) {
  using namespace asio::experimental::awaitable_operators;
  auto self = shared_from_this();
  const auto& cfg = proxy_.config();
  std::error_code ec;
  server_.open(target.protocol(), ec);
  if (!ec && cfg.mark != 0) {
    std::uint32_t mark = cfg.mark;
    if (::setsockopt(server_.native_handle(), SOL_SOCKET, SO_MARK, &mark, sizeof(mark)) != 0)
      ec = std::error_code(errno, std::generic_category());
  }
  if (!ec) ec = co_await connect_with_timeout(server_, target, ms(cfg.connect_timeout_ms));
  if (ec || aborted_) {
    if (!aborted_ && cfg.verbose)
      std::fprintf(stderr, "delay-proxy: conn %llu: connect %s failed: %s\n",
                   static_cast<unsigned long long>(id_), to_string(target).c_str(),
                   ec.message().c_str());
    proxy_.note_failed();
    abort(true);  // the client sees a reset, as it would for a refused connection
    proxy_.remove(this);
    co_return;
  }
  client_.set_option(tcp::no_delay(true), ec);
  server_.set_option(tcp::no_delay(true), ec);
  if (cfg.verbose)
    std::fprintf(stderr, "delay-proxy: conn %llu: connected to %s\n",
                 static_cast<unsigned long long>(id_), to_string(target).c_str());

  co_await (read_loop(client_, up_, proxy_.up(), "up") &&
            write_loop(server_, up_, proxy_.up(), "up") &&
            read_loop(server_, down_, proxy_.down(), "down") &&
            write_loop(client_, down_, proxy_.down(), "down"));
  if (cfg.verbose)
    std::fprintf(stderr, "delay-proxy: conn %llu: closed%s\n", static_cast<unsigned long long>(id_),
                 aborted_ ? " (aborted)" : "");
  close_socket(client_);
  close_socket(server_);
  proxy_.remove(this);
}

awaitable<void> Connection::read_loop(tcp::socket& src, Pipe& pipe, Direction& dir,
                                      const char* name) {
  const std::size_t max_buffer = proxy_.config().max_buffer;
  std::vector<std::uint8_t> buf(64 * 1024);
  for (;;) {
    while (pipe.buffered >= max_buffer && !aborted_) {
      pipe.to_reader.reset();
      co_await pipe.to_reader.wait();
    }
    if (aborted_) co_return;
    auto [ec, n] = co_await src.async_read_some(asio::buffer(buf), use_nothrow);
    if (aborted_) co_return;
    Chunk c;
    c.release = dir.release_time(Clock::now(), pipe.last_release);
    pipe.last_release = c.release;
    if (ec) {
      c.kind = ec == asio::error::eof ? Chunk::eof : Chunk::reset;
      if (proxy_.config().verbose && c.kind == Chunk::reset)
        std::fprintf(stderr, "delay-proxy: conn %llu: %s read error: %s\n",
                     static_cast<unsigned long long>(id_), name, ec.message().c_str());
    } else {
      c.bytes.assign(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
      pipe.buffered += n + kChunkOverhead;
    }
    bool last = c.kind != Chunk::data;
    pipe.queue.push_back(std::move(c));
    pipe.to_writer.set();
    if (last) co_return;
  }
}

awaitable<void> Connection::write_loop(tcp::socket& dst, Pipe& pipe, Direction& dir,
                                       const char* name) {
  // Waits out any link stall in progress; false if the connection was aborted meanwhile.
  auto wait_stall = [&]() -> awaitable<bool> {
    for (;;) {
      TimePoint now = Clock::now();
      TimePoint until = proxy_.stalls().release_after(now);
      if (until <= now) co_return !aborted_;
      co_await sleep_until(pipe.timer, until);
      if (aborted_) co_return false;
    }
  };
  for (;;) {
    while (pipe.queue.empty() && !aborted_) {
      pipe.to_writer.reset();
      co_await pipe.to_writer.wait();
    }
    if (aborted_) co_return;
    Chunk& c = pipe.queue.front();  // deque references survive push_back
    co_await sleep_until(pipe.timer, c.release);
    if (aborted_ || !co_await wait_stall()) co_return;
    if (c.kind == Chunk::eof) {
      std::error_code ec;
      dst.shutdown(tcp::socket::shutdown_send, ec);
      pipe.queue.pop_front();
      co_return;
    }
    if (c.kind == Chunk::reset) {
      pipe.queue.pop_front();
      abort(true);
      co_return;
    }
    const std::size_t piece = dir.piece_size();
    std::size_t off = 0;
    while (off < c.bytes.size()) {
      std::size_t n = std::min(piece, c.bytes.size() - off);
      if (dir.paced()) {
        co_await sleep_until(pipe.timer, dir.reserve(n, Clock::now()));
        if (aborted_ || !co_await wait_stall()) co_return;
      }
      auto [ec, w] =
          co_await asio::async_write(dst, asio::buffer(c.bytes.data() + off, n), use_nothrow);
      if (aborted_) co_return;
      if (ec) {
        if (proxy_.config().verbose)
          std::fprintf(stderr, "delay-proxy: conn %llu: %s write error: %s\n",
                       static_cast<unsigned long long>(id_), name, ec.message().c_str());
        abort(true);
        co_return;
      }
      off += n;
      dir.bytes += n;
    }
    pipe.buffered -= c.bytes.size() + kChunkOverhead;
    pipe.queue.pop_front();
    pipe.to_reader.set();
  }
}

// ---------------------------------------------------------------------------------------------
// Proxy

Proxy::Proxy(asio::io_context& io, ProxyConfig cfg)
    : io_(io),
      cfg_(std::move(cfg)),
      acceptor_(io),
      signals_(io, SIGINT, SIGTERM),
      up_(cfg_.up, cfg_.seed * 2 + 1),
      down_(cfg_.down, cfg_.seed * 2 + 2),
      stalls_(cfg_.stall_every_ms, cfg_.stall_ms, cfg_.seed, Clock::now()) {}

std::error_code Proxy::open(tcp::endpoint& bound) {
  std::error_code ec;
  acceptor_.open(cfg_.listen.protocol(), ec);
  if (ec) return ec;
  acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  acceptor_.bind(cfg_.listen, ec);
  if (ec) return ec;
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return ec;
  bound = acceptor_.local_endpoint(ec);
  return ec;
}

void Proxy::start() {
  signals_.async_wait([this](std::error_code ec, int sig) {
    if (ec) return;
    if (cfg_.verbose) std::fprintf(stderr, "delay-proxy: signal %d, stopping\n", sig);
    stop();
  });
  asio::co_spawn(io_, accept_loop(), asio::detached);
}

void Proxy::stop() {
  if (stopping_) return;
  stopping_ = true;
  std::error_code ec;
  acceptor_.close(ec);
  signals_.cancel(ec);
  auto conns = conns_;  // abort() does not remove synchronously, but be safe
  for (auto& [id, c] : conns) c->abort(false);
}

void Proxy::remove(Connection* c) {
  conns_.erase(c->id());
}

std::optional<tcp::endpoint> Proxy::original_destination(tcp::socket& s) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getsockopt(s.native_handle(), SOL_IP, SO_ORIGINAL_DST, &addr, &len) != 0)
    return std::nullopt;
  if (addr.sin_family != AF_INET) return std::nullopt;
  tcp::endpoint ep(asio::ip::address_v4(ntohl(addr.sin_addr.s_addr)), ntohs(addr.sin_port));
  std::error_code ec;
  tcp::endpoint local = s.local_endpoint(ec);
  if (ec || ep == local) return std::nullopt;  // not redirected: would loop into ourselves
  return ep;
}

awaitable<void> Proxy::accept_loop() {
  for (;;) {
    auto [ec, sock] = co_await acceptor_.async_accept(use_nothrow);
    if (stopping_) co_return;
    if (ec) {
      if (ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor) co_return;
      // Out of descriptors and similar: back off briefly instead of spinning.
      std::fprintf(stderr, "delay-proxy: accept: %s\n", ec.message().c_str());
      asio::steady_timer t(io_, ms(50));
      co_await t.async_wait(use_nothrow);
      continue;
    }
    std::optional<tcp::endpoint> target = cfg_.target;
    if (!target) target = original_destination(sock);
    if (!target) {
      std::fprintf(stderr, "delay-proxy: connection without a redirected destination, reset\n");
      ++failed_;
      reset_socket(sock);
      continue;
    }
    auto c = std::make_shared<Connection>(*this, std::move(sock), next_id_++);
    conns_.emplace(c->id(), c);
    ++accepted_;
    c->start(*target);
  }
}

}  // namespace netlab
