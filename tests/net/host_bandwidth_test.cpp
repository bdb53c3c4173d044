// Host bandwidth limits (HostConfig::max_upload/download_bytes_per_second): the token bucket's
// arithmetic, and transfers through limited hosts over loopback.
#include <gtest/gtest.h>

#include <sodium.h>

#include "starling/net/host.hpp"
#include "starling/net/tcp.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

TEST(TokenBucket, BurstThenRate) {
  const TimePoint t0{};
  TokenBucket b(1000, 500, t0);                     // 1000 B/s, bursts of 500 B
  EXPECT_EQ(b.reserve(500, t0), Duration::zero());  // the burst is free
  EXPECT_EQ(b.reserve(100, t0), 100ms);             // then 100 B cost 100 ms
  EXPECT_EQ(b.reserve(100, t0), 200ms);             // and the debt adds up
  // Half a second later 500 B were refilled: the debt (200) is paid, 300 left.
  EXPECT_EQ(b.reserve(300, t0 + 500ms), Duration::zero());
  // Idle time never banks more than one burst.
  EXPECT_EQ(b.reserve(500, t0 + 100s), Duration::zero());
  EXPECT_EQ(b.reserve(1, t0 + 100s), 1ms);
  TokenBucket dflt(10'000'000);
  EXPECT_EQ(dflt.burst(), 1'000'000u);  // 100 ms worth
  TokenBucket slow(1000);
  EXPECT_EQ(slow.burst(), 16u * 1024);  // at least 16 KiB
}

namespace {

constexpr const char* kSink = "/test/sink/1.0.0";
constexpr std::uint64_t kRate = 512 * 1024;  // bytes per second
constexpr std::size_t kBytes = 1024 * 1024;  // two seconds' worth
constexpr std::uint64_t kBurst = 64 * 1024;

// Reads everything, then answers with one byte.
awaitable<void> sink(ByteStreamPtr s, PeerId) {
  Bytes buf(64 * 1024);
  for (;;) {
    auto n = co_await s->read_some(buf);
    if (!n) break;
  }
  (void)co_await s->write(as_bytes("k"));
  (void)co_await s->close_write();
}

// Sends kBytes from `from` to `to`'s sink; how long until the sink acknowledged them.
awaitable<result<Duration>> transfer(Host& from, Host& to) {
  ST_CO_TRY(co_await from.connect(to.listen_addresses().at(0)));
  Bytes data(kBytes);
  randombytes_buf(data.data(), data.size());
  const auto t0 = Clock::now();
  ST_CO_TRY(auto s, co_await from.open_stream(to.local_peer(), kSink, 30s));
  ST_CO_TRY(co_await s->write(data));
  ST_CO_TRY(co_await s->close_write());
  std::array<std::uint8_t, 1> ack{};
  ST_CO_TRY(co_await with_timeout(read_exact(*s, ack), 30s, "sink ack"));
  co_return Clock::now() - t0;
}

struct Case {
  std::uint64_t up = 0, down = 0;  // limits of the sender's and the receiver's host
};

Duration run_transfer(Case c) {
  asio::io_context io;
  HostConfig send_cfg, recv_cfg;
  send_cfg.max_upload_bytes_per_second = c.up;
  send_cfg.bandwidth_burst_bytes = kBurst;
  recv_cfg.max_download_bytes_per_second = c.down;
  recv_cfg.bandwidth_burst_bytes = kBurst;
  auto a = Host::create(io.get_executor(), crypto::KeyPair::generate(), send_cfg);
  auto b = Host::create(io.get_executor(), crypto::KeyPair::generate(), recv_cfg);
  b->set_stream_handler(kSink, sink);
  Duration took{};
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await a->start());
    CO_ASSERT_OK(co_await b->start());
    auto t = co_await transfer(*a, *b);
    CO_ASSERT_OK(t);
    took = t.value();
    co_await a->stop();
    co_await b->stop();
  });
  return took;
}

// The least time the limit allows for kBytes: everything but one burst at the rate.
constexpr Duration kFloor = std::chrono::milliseconds((kBytes - kBurst) * 1000 / kRate);

}  // namespace

TEST(HostBandwidth, UploadLimitSlowsTheSender) {
  const Duration took = run_transfer({kRate, 0});
  EXPECT_GE(took, kFloor) << "1 MiB at 512 KiB/s took only " << took.count() / 1000000 << " ms";
}

TEST(HostBandwidth, DownloadLimitSlowsTheReceiver) {
  const Duration took = run_transfer({0, kRate});
  EXPECT_GE(took, kFloor) << "1 MiB at 512 KiB/s took only " << took.count() / 1000000 << " ms";
}

TEST(HostBandwidth, UnlimitedIsUnaffected) {
  // No limiter in the path: 1 MiB over loopback takes milliseconds; the bound is the limited
  // transfers' floor, far above that even on a loaded machine.
  const Duration took = run_transfer({0, 0});
  EXPECT_LT(took, kFloor);
}
