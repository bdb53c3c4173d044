// Yamux performance: window auto-tuning over a link with latency (in-process delaying proxy),
// and throughput over loopback TCP next to raw TCP (printed for the report).
// STARLING_YAMUX_BENCH_MB sets the bulk transfer size (default 512, 64 under ASan) and
// STARLING_YAMUX_BENCH_ROUNDS the number of rounds (default 3).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <asio/io_context.hpp>

#include "starling/net/yamux.hpp"
#include "yamux_test_util.hpp"

using namespace starling;
using namespace starling::net;
using starling::test::run_with_deadline;

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kDefaultBenchMb = 64;  // sanitizers make big transfers slow
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr std::size_t kDefaultBenchMb = 64;
#else
constexpr std::size_t kDefaultBenchMb = 512;
#endif
#else
constexpr std::size_t kDefaultBenchMb = 512;
#endif

std::size_t bench_bytes() {
  const char* env = std::getenv("STARLING_YAMUX_BENCH_MB");
  const std::size_t mb = env ? std::strtoull(env, nullptr, 10) : kDefaultBenchMb;
  return (mb ? mb : kDefaultBenchMb) << 20;
}

int bench_rounds() {
  const char* env = std::getenv("STARLING_YAMUX_BENCH_ROUNDS");
  const int n = env ? std::atoi(env) : 3;
  return n > 0 ? n : 3;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double mb_per_s(std::size_t bytes, Duration d) {
  return static_cast<double>(bytes) / (1 << 20) / std::chrono::duration<double>(d).count();
}

// Writes `total` bytes (in 1 MiB writes of `chunk`) then FIN.
awaitable<result<void>> send_bulk(ByteStream& s, std::size_t total, BytesView chunk) {
  for (std::size_t sent = 0; sent < total;) {
    const std::size_t n = std::min(chunk.size(), total - sent);
    ST_CO_TRY(co_await s.write(chunk.first(n)));
    sent += n;
  }
  co_return co_await s.close_write();
}

// Reads until FIN; returns the byte count.
awaitable<result<std::size_t>> drain(ByteStream& s) {
  Bytes buf(256 * 1024);
  std::size_t got = 0;
  for (;;) {
    auto n = co_await s.read_some(buf);
    if (!n) {
      if (n.error() == errc::closed) co_return got;
      co_return n.error();
    }
    got += n.value();
  }
}

// Transfers `per_stream` bytes on each of `streams` streams from client to server; returns
// the elapsed time (0 on failure).
Duration yamux_transfer(asio::io_context& io, std::shared_ptr<YamuxSession> client,
                        std::shared_ptr<YamuxSession> server, int streams, std::size_t per_stream) {
  const Bytes chunk = test::pattern(1 << 20, 5);
  Duration took{0};
  run_with_deadline(
      io,
      [&]() -> awaitable<void> {
        int done = 0;
        bool failed = false;
        AsyncEvent all(io.get_executor());
        const auto t0 = Clock::now();
        for (int i = 0; i < streams; ++i) {
          asio::co_spawn(
              io,
              [&]() -> awaitable<void> {
                auto st = co_await client->open_stream();
                if (!st || !co_await send_bulk(*st.value(), per_stream, chunk)) failed = true;
                // Wait for the server's FIN so the stream is finished on both sides.
                if (st) (void)co_await drain(*st.value());
              },
              asio::detached);
          asio::co_spawn(
              io,
              [&]() -> awaitable<void> {
                auto st = co_await server->accept_stream();
                if (!st) {
                  failed = true;
                } else {
                  auto n = co_await drain(*st.value());
                  if (!n || n.value() != per_stream) failed = true;
                  (void)co_await st.value()->close_write();
                }
                if (++done == streams) all.set();
              },
              asio::detached);
        }
        (void)co_await all.wait();
        took = Clock::now() - t0;
        EXPECT_FALSE(failed);
        co_await client->close();
        co_await server->close();
      },
      600s);
  return took;
}

Duration raw_tcp_transfer(asio::io_context& io, std::size_t total) {
  auto [a, b] = test::tcp_pair(io);
  const Bytes chunk = test::pattern(1 << 20, 5);
  Duration took{0};
  run_with_deadline(
      io,
      [&]() -> awaitable<void> {
        const auto t0 = Clock::now();
        auto w = [&]() -> awaitable<result<void>> { return send_bulk(*a, total, chunk); };
        auto r = [&]() -> awaitable<result<std::size_t>> { return drain(*b); };
        using namespace asio::experimental::awaitable_operators;
        auto [wr, rd] = co_await (w() && r());
        took = Clock::now() - t0;
        EXPECT_TRUE(wr);
        EXPECT_TRUE(rd && rd.value() == total);
      },
      600s);
  return took;
}

}  // namespace

TEST(YamuxPerf, WindowAutoTuningFillsALinkWithLatency) {
  // 10 ms each way. A fixed 256 KiB window allows at most 256 KiB per 20 ms RTT = 12.5 MiB/s.
  const std::size_t total = 32u << 20;
  Duration tuned, fixed;
  YamuxStats tuned_stats, fixed_stats;
  {
    asio::io_context io;
    auto [c, s] = test::DelayProxy::create(io, 10ms);
    auto client = YamuxSession::create(c, true);
    auto server = YamuxSession::create(s, false);
    client->start();
    server->start();
    tuned = yamux_transfer(io, client, server, 1, total);
    tuned_stats = server->stats();
  }
  {
    asio::io_context io;
    auto [c, s] = test::DelayProxy::create(io, 10ms);
    YamuxConfig off;
    off.auto_tune_window = false;
    auto client = YamuxSession::create(c, true, off);
    auto server = YamuxSession::create(s, false, off);
    client->start();
    server->start();
    fixed = yamux_transfer(io, client, server, 1, total / 4);
    fixed_stats = server->stats();
  }
  const double tuned_rate = mb_per_s(total, tuned);
  const double fixed_rate = mb_per_s(total / 4, fixed);
  std::printf(
      "[yamux] 20 ms RTT: auto-tuned %.1f MiB/s (largest window %u KiB, %llu doublings, "
      "rtt %.1f ms) vs fixed 256 KiB window %.1f MiB/s\n",
      tuned_rate, tuned_stats.largest_recv_window / 1024,
      static_cast<unsigned long long>(tuned_stats.window_growths),
      std::chrono::duration<double, std::milli>(tuned_stats.rtt).count(), fixed_rate);
  EXPECT_GT(tuned_stats.window_growths, 0u);
  EXPECT_GE(tuned_stats.largest_recv_window, 2u << 20);
  EXPECT_EQ(fixed_stats.largest_recv_window, 256u * 1024);
  EXPECT_LE(fixed_rate, 13.5);  // the window bound (plus measurement slack)
  EXPECT_GT(tuned_rate, 2 * fixed_rate);
}

TEST(YamuxPerf, SessionBudgetCapsWindowGrowthAcrossStreams) {
  asio::io_context io;
  // 4 streams over a 20 ms RTT: each is window-limited (256 KiB / 20 ms) so all want to grow.
  auto [c, s] = test::DelayProxy::create(io, 10ms);
  YamuxConfig cfg;
  cfg.session_window_budget = 2u << 20;
  auto client = YamuxSession::create(c, true, cfg);
  auto server = YamuxSession::create(s, false, cfg);
  client->start();
  server->start();
  const auto took = yamux_transfer(io, client, server, 4, 8u << 20);
  const auto st = server->stats();
  std::printf(
      "[yamux] 4 streams, 20 ms RTT, 2 MiB growth budget: %.1f MiB/s, largest window %u "
      "KiB, budget peak %zu KiB\n",
      mb_per_s(32u << 20, took), st.largest_recv_window / 1024, st.window_budget_peak / 1024);
  EXPECT_GT(st.window_growths, 0u);
  EXPECT_GT(st.window_budget_peak, 0u);
  EXPECT_LE(st.window_budget_peak, cfg.session_window_budget);
  EXPECT_EQ(st.window_budget_used, 0u);  // released when the streams finished
}

TEST(YamuxPerf, ThroughputOverLoopbackTcp) {
  // Rounds alternate raw TCP, one yamux stream and eight yamux streams so that load from
  // other processes hits all three alike; the medians are reported.
  const std::size_t total = bench_bytes();
  const int rounds = bench_rounds();
  std::vector<double> raw, one, eight;
  std::uint32_t window = 0;
  for (int r = 0; r < rounds; ++r) {
    {
      asio::io_context io;
      raw.push_back(mb_per_s(total, raw_tcp_transfer(io, total)));
    }
    {
      asio::io_context io;
      auto p = test::session_pair(io);
      one.push_back(mb_per_s(total, yamux_transfer(io, p.client, p.server, 1, total)));
      window = std::max(window, p.server->stats().largest_recv_window);
    }
    {
      asio::io_context io;
      auto p = test::session_pair(io);
      eight.push_back(mb_per_s(total, yamux_transfer(io, p.client, p.server, 8, total / 8)));
    }
  }
  const double raw_rate = median(raw), one_rate = median(one), eight_rate = median(eight);
  std::printf(
      "[yamux] %zu MiB over loopback TCP, median of %d rounds: raw TCP %.0f MiB/s, "
      "yamux 1 stream %.0f MiB/s (%.0f%% of raw, largest window %u KiB), yamux 8 "
      "streams %.0f MiB/s (%.0f%% of raw)\n",
      total >> 20, rounds, raw_rate, one_rate, 100 * one_rate / raw_rate, window / 1024, eight_rate,
      100 * eight_rate / raw_rate);
  EXPECT_GT(one_rate, 0.0);
  EXPECT_GT(eight_rate, 0.0);
}
