// starling-netprobe: tiny TCP measurement tool for netlab tests (no python/socat needed).
//
//   starling-netprobe server --listen 127.0.0.1:0 [--mode echo|rst|sink]
//   starling-netprobe rtt    --connect ADDR:PORT [--count 20] [--size 64] [--interval-ms 0]
//   starling-netprobe bulk   --connect ADDR:PORT [--bytes N] [--conns C]   # echo + verify
//   starling-netprobe expect-reset --connect ADDR:PORT
//
// The server prints "listening ADDR:PORT" and runs until SIGINT/SIGTERM. Clients have a
// global deadline (--timeout-ms) and exit 0 on success, 1 on a failed check, 3 on timeout.
// Threading rule: one io_context, one thread.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <vector>

#include <CLI/CLI.hpp>

#include "netlab_io.hpp"

namespace netlab {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Deterministic test pattern: byte `off` of stream `seed` (one hash per 8 bytes).
void fill_pattern(std::uint64_t seed, std::uint64_t off, std::uint8_t* out, std::size_t n) {
  std::uint64_t word = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t o = off + i;
    if (i == 0 || (o & 7) == 0) word = splitmix64(seed * 0x100000001b3ULL + (o >> 3));
    out[i] = static_cast<std::uint8_t>(word >> ((o & 7) * 8));
  }
}

// ---------------------------------------------------------------------------------------------
// server

awaitable<void> serve_one(tcp::socket s, std::string mode) {
  std::vector<std::uint8_t> buf(64 * 1024);
  std::error_code ec;
  s.set_option(tcp::no_delay(true), ec);
  if (mode == "rst") {
    co_await s.async_read_some(asio::buffer(buf), use_nothrow);
    reset_socket(s);
    co_return;
  }
  for (;;) {
    auto [e, n] = co_await s.async_read_some(asio::buffer(buf), use_nothrow);
    if (e == asio::error::eof) {
      s.shutdown(tcp::socket::shutdown_send, ec);
      break;
    }
    if (e) break;
    if (mode == "echo") {
      auto [we, w] = co_await asio::async_write(s, asio::buffer(buf.data(), n), use_nothrow);
      if (we) break;
    }
  }
  close_socket(s);
}

int run_server(const std::string& listen, const std::string& mode) {
  auto ep = parse_endpoint(listen);
  if (!ep) {
    std::fprintf(stderr, "netprobe: bad --listen '%s'\n", listen.c_str());
    return 2;
  }
  asio::io_context io;
  tcp::acceptor acc(io);
  std::error_code ec;
  acc.open(ep->protocol(), ec);
  if (!ec) acc.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acc.bind(*ep, ec);
  if (!ec) acc.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    std::fprintf(stderr, "netprobe: listen %s: %s\n", listen.c_str(), ec.message().c_str());
    return 1;
  }
  std::printf("listening %s\n", to_string(acc.local_endpoint()).c_str());
  std::fflush(stdout);
  asio::signal_set sigs(io, SIGINT, SIGTERM);
  sigs.async_wait([&](std::error_code, int) { io.stop(); });
  asio::co_spawn(
      io,
      [&]() -> awaitable<void> {
        for (;;) {
          auto [e, s] = co_await acc.async_accept(use_nothrow);
          if (e == asio::error::operation_aborted) co_return;
          if (e) continue;
          asio::co_spawn(io, serve_one(std::move(s), mode), asio::detached);
        }
      },
      asio::detached);
  io.run();
  return 0;
}

// ---------------------------------------------------------------------------------------------
// clients

struct ClientOpts {
  tcp::endpoint target;
  double timeout_ms = 30000;
  int count = 20;
  std::size_t size = 64;
  double interval_ms = 0;
  std::uint64_t bytes = 1 << 20;
  int conns = 1;
  bool samples = false;
};

// Runs `body` with the global deadline; returns its exit code, or 3 on timeout. On timeout
// the io_context is stopped and destroyed, which destroys the suspended coroutines.
int run_client(const ClientOpts& o, std::function<awaitable<int>(const ClientOpts&)> body) {
  int rc = 3;
  asio::io_context io;
  asio::steady_timer deadline(io, ms(o.timeout_ms));
  deadline.async_wait([&](std::error_code ec) {
    if (ec) return;
    std::fprintf(stderr, "netprobe: timed out after %.0f ms\n", o.timeout_ms);
    io.stop();
  });
  asio::co_spawn(io, body(o), [&](std::exception_ptr e, int r) {
    rc = e ? 1 : r;
    io.stop();
  });
  io.run();
  return rc;
}

awaitable<std::error_code> dial(tcp::socket& s, const ClientOpts& o) {
  auto ec = co_await connect_with_timeout(s, o.target, ms(o.timeout_ms));
  if (!ec) s.set_option(tcp::no_delay(true), ec);
  co_return ec;
}

awaitable<int> rtt_body(const ClientOpts& o) {
  tcp::socket s(co_await asio::this_coro::executor);
  if (auto ec = co_await dial(s, o)) {
    std::fprintf(stderr, "netprobe: connect %s: %s\n", to_string(o.target).c_str(),
                 ec.message().c_str());
    co_return 1;
  }
  std::vector<std::uint8_t> out(o.size), in(o.size);
  std::vector<double> rtts;
  asio::steady_timer pause(s.get_executor());
  for (int i = 0; i < o.count; ++i) {
    fill_pattern(7, static_cast<std::uint64_t>(i) * o.size, out.data(), out.size());
    auto t0 = Clock::now();
    auto [we, w] = co_await asio::async_write(s, asio::buffer(out), use_nothrow);
    if (we) {
      std::fprintf(stderr, "netprobe: write: %s\n", we.message().c_str());
      co_return 1;
    }
    auto [re, r] = co_await asio::async_read(s, asio::buffer(in), use_nothrow);
    if (re) {
      std::fprintf(stderr, "netprobe: read: %s\n", re.message().c_str());
      co_return 1;
    }
    rtts.push_back(to_ms(Clock::now() - t0));
    if (in != out) {
      std::fprintf(stderr, "netprobe: echo mismatch in round %d\n", i);
      co_return 1;
    }
    if (o.samples) std::printf("sample %d %.3f\n", i, rtts.back());
    if (o.interval_ms > 0) co_await sleep_until(pause, Clock::now() + ms(o.interval_ms));
  }
  std::vector<double> sorted = rtts;
  std::sort(sorted.begin(), sorted.end());
  double mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / sorted.size();
  auto pct = [&](double p) {
    return sorted[std::min(sorted.size() - 1, std::size_t(p * sorted.size()))];
  };
  std::printf("rtt_ms count=%zu min=%.3f median=%.3f mean=%.3f p90=%.3f max=%.3f\n", sorted.size(),
              sorted.front(), pct(0.5), mean, pct(0.9), sorted.back());
  std::fflush(stdout);
  co_return 0;
}

// One bulk connection: sends `bytes` of pattern `seed`, half-closes, reads the echo until EOF
// and verifies it byte for byte. Returns the number of bytes verified, or -1.
awaitable<std::int64_t> bulk_one(const ClientOpts& o, std::uint64_t seed) {
  using namespace asio::experimental::awaitable_operators;
  tcp::socket s(co_await asio::this_coro::executor);
  if (auto ec = co_await dial(s, o)) {
    std::fprintf(stderr, "netprobe: connect %s: %s\n", to_string(o.target).c_str(),
                 ec.message().c_str());
    co_return -1;
  }
  auto sender = [&]() -> awaitable<bool> {
    std::vector<std::uint8_t> buf(64 * 1024);
    for (std::uint64_t off = 0; off < o.bytes;) {
      std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), o.bytes - off));
      fill_pattern(seed, off, buf.data(), n);
      auto [e, w] = co_await asio::async_write(s, asio::buffer(buf.data(), n), use_nothrow);
      if (e) {
        std::fprintf(stderr, "netprobe: bulk write: %s\n", e.message().c_str());
        co_return false;
      }
      off += n;
    }
    std::error_code ec;
    s.shutdown(tcp::socket::shutdown_send, ec);  // half-close: the echo must still arrive
    co_return true;
  };
  auto receiver = [&]() -> awaitable<std::int64_t> {
    std::vector<std::uint8_t> buf(64 * 1024), want(64 * 1024);
    std::uint64_t off = 0;
    for (;;) {
      auto [e, n] = co_await s.async_read_some(asio::buffer(buf), use_nothrow);
      if (e == asio::error::eof) break;
      if (e) {
        std::fprintf(stderr, "netprobe: bulk read at %llu: %s\n",
                     static_cast<unsigned long long>(off), e.message().c_str());
        co_return -1;
      }
      fill_pattern(seed, off, want.data(), n);
      if (off + n > o.bytes || !std::equal(buf.begin(), buf.begin() + n, want.begin())) {
        std::fprintf(stderr, "netprobe: bulk data mismatch near offset %llu\n",
                     static_cast<unsigned long long>(off));
        co_return -1;
      }
      off += n;
    }
    if (off != o.bytes) {
      std::fprintf(stderr, "netprobe: bulk got %llu of %llu bytes before EOF\n",
                   static_cast<unsigned long long>(off), static_cast<unsigned long long>(o.bytes));
      co_return -1;
    }
    co_return static_cast<std::int64_t>(off);
  };
  auto [sent, got] = co_await (sender() && receiver());
  co_return sent ? got : -1;
}

awaitable<int> bulk_body(const ClientOpts& o) {
  auto ex = co_await asio::this_coro::executor;
  auto t0 = Clock::now();
  int done = 0, ok = 0;
  asio::steady_timer all_done(ex, TimePoint::max());
  for (int i = 0; i < o.conns; ++i) {
    asio::co_spawn(
        ex,
        [&, i]() -> awaitable<void> {
          auto r = co_await bulk_one(o, 1000 + static_cast<std::uint64_t>(i));
          if (r >= 0) ++ok;
          if (++done == o.conns) all_done.cancel();
        },
        asio::detached);
  }
  while (done < o.conns) co_await all_done.async_wait(use_nothrow);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  double mbit = static_cast<double>(o.bytes) * o.conns * 8 / secs / 1e6;
  std::printf("bulk %s conns=%d ok=%d bytes=%llu secs=%.3f mbit=%.3f\n",
              ok == o.conns ? "ok" : "FAILED", o.conns, ok,
              static_cast<unsigned long long>(o.bytes), secs, mbit);
  std::fflush(stdout);
  co_return ok == o.conns ? 0 : 1;
}

awaitable<int> reset_body(const ClientOpts& o) {
  // A reset may already hit the connect or the first write (loopback is fast); any of them
  // counts, an orderly EOF or another error does not.
  auto is_reset = [](const std::error_code& e) {
    return e == asio::error::connection_reset || e == asio::error::broken_pipe;
  };
  tcp::socket s(co_await asio::this_coro::executor);
  std::error_code err = co_await dial(s, o);
  if (!err) {
    std::uint8_t b[16] = {};
    auto [we, w] = co_await asio::async_write(s, asio::buffer(b), use_nothrow);
    err = we;
  }
  std::vector<std::uint8_t> buf(4096);
  while (!err) {
    auto [e, n] = co_await s.async_read_some(asio::buffer(buf), use_nothrow);
    err = e;
  }
  if (is_reset(err)) {
    std::printf("reset ok (%s)\n", err.message().c_str());
    co_return 0;
  }
  std::fprintf(stderr, "netprobe: expected a reset, got: %s\n", err.message().c_str());
  co_return 1;
}

}  // namespace
}  // namespace netlab

int main(int argc, char** argv) {
  using namespace netlab;
  CLI::App app{"netlab TCP probe: echo server, RTT, bulk echo with verification, reset check."};
  app.require_subcommand(1);
  std::string listen = "127.0.0.1:0", mode = "echo", connect;
  ClientOpts o;
  auto* server = app.add_subcommand("server", "echo (or rst/sink) server");
  server->add_option("--listen", listen);
  server->add_option("--mode", mode)->check(CLI::IsMember({"echo", "rst", "sink"}));
  auto add_client = [&](const char* name, const char* help) {
    auto* c = app.add_subcommand(name, help);
    c->add_option("--connect", connect)->required();
    c->add_option("--timeout-ms", o.timeout_ms)->check(CLI::Range(1.0, 1e9));
    return c;
  };
  auto* rtt = add_client("rtt", "ping-pong RTT through an echo server");
  rtt->add_option("--count", o.count)->check(CLI::Range(1, 1000000));
  rtt->add_option("--size", o.size)->check(CLI::Range(1, 1 << 20));
  rtt->add_option("--interval-ms", o.interval_ms)->check(CLI::Range(0.0, 1e7));
  rtt->add_flag("--samples", o.samples, "print every sample");
  auto* bulk = add_client("bulk", "send a pattern, half-close, verify the echo");
  bulk->add_option("--bytes", o.bytes)->check(CLI::Range(0ull, 1ull << 40));
  bulk->add_option("--conns", o.conns)->check(CLI::Range(1, 10000));
  auto* rst = add_client("expect-reset", "succeed only if the connection gets reset");
  CLI11_PARSE(app, argc, argv);

  if (server->parsed()) return run_server(listen, mode);
  auto t = parse_endpoint(connect);
  if (!t) {
    std::fprintf(stderr, "netprobe: bad --connect '%s'\n", connect.c_str());
    return 2;
  }
  o.target = *t;
  if (rtt->parsed()) return run_client(o, rtt_body);
  if (bulk->parsed()) return run_client(o, bulk_body);
  if (rst->parsed()) return run_client(o, reset_body);
  return 2;
}
