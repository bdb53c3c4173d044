// Heap held per connection (both ends in this process): N hosts dial one hub, each opens one
// echo stream of a DHT-sized message (identify runs on every connection as in real use). Prints
// the breakdown (after the dial, after a stream) and bounds it, so that per-connection buffers
// stay allocated on demand (a node holds hundreds of connections: docs/benchmarks.md, DHT).
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdio>

#include "starling/net/echo.hpp"
#include "starling/net/host.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

namespace {
// Bytes in use on the heap (arenas and mmapped chunks), 0 when a sanitizer replaces malloc.
std::size_t heap_in_use() {
  const auto m = mallinfo2();
  return m.uordblks + m.hblkhd;
}
}  // namespace

TEST(HostMemory, PerConnectionHeapIsSmall) {
  constexpr std::size_t kConns = 24;
  asio::io_context io;
  auto hub = Host::create(io.get_executor(), crypto::KeyPair::generate());
  std::vector<std::shared_ptr<Host>> dialers;
  for (std::size_t i = 0; i < kConns; ++i)
    dialers.push_back(Host::create(io.get_executor(), crypto::KeyPair::generate()));
  std::size_t before = 0, connected = 0, streamed = 0;
  auto warm = Host::create(io.get_executor(), crypto::KeyPair::generate());
  const Bytes msg(300, 7);  // a DHT request's size
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await hub->start());
    install_echo(*hub);
    for (auto& d : dialers) CO_ASSERT_OK(co_await d->start());
    // Warm up one connection so one-time allocations (loggers, tables) are not counted.
    CO_ASSERT_OK(co_await warm->start());
    CO_ASSERT_OK(co_await warm->connect(hub->listen_addresses().at(0)));
    CO_ASSERT_OK(co_await echo(*warm, hub->local_peer(), msg, 10s));
    before = heap_in_use();
    for (auto& d : dialers) {
      CO_ASSERT_OK(co_await d->connect(hub->listen_addresses().at(0)));
      CO_ASSERT_OK(co_await d->wait_identified(hub->local_peer(), 10s));
      CO_ASSERT_OK(co_await hub->wait_identified(d->local_peer(), 10s));
    }
    connected = heap_in_use();
    for (auto& d : dialers) CO_ASSERT_OK(co_await echo(*d, hub->local_peer(), msg, 10s));
    streamed = heap_in_use();
    co_await warm->stop();
    for (auto& d : dialers) co_await d->stop();
    co_await hub->stop();
  });
  if (before == 0) GTEST_SKIP() << "mallinfo2 unavailable (sanitizer build)";
  const auto per = [&](std::size_t a, std::size_t b) {
    return b > a ? static_cast<double>(b - a) / kConns / 1024.0 : 0.0;
  };
  std::printf(
      "heap per connection (both ends): %.1f KiB after dial + identify, %.1f KiB after "
      "one echo stream\n",
      per(before, connected), per(before, streamed));
  EXPECT_LT(per(before, streamed),
            128.0);  // 578 KiB before yamux's read buffer grew on demand, 74 after
}
