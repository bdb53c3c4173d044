// TcpStream: direct writes, and the write stall deadline (a peer that stops reading).
#include <gtest/gtest.h>

#include "starling/core/async.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

TEST(TcpStream, WriteThenReadRoundTrip) {
  asio::io_context io;
  auto [a, b] = test::tcp_pair(io);
  test::run_with_deadline(io, [&, a = a, b = b]() -> awaitable<void> {
    Bytes data(3 << 20);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 7);
    // The reader runs concurrently: the writer must wait for it (send buffer full) and resume.
    Bytes got(data.size());
    TaskScope scope(co_await asio::this_coro::executor);
    scope.spawn([](std::shared_ptr<TcpStream> b, Bytes& got) -> awaitable<void> {
      (void)co_await read_exact(*b, got);
    }(b, got));
    CO_ASSERT_OK(co_await a->write(data));
    CO_ASSERT_OK(co_await scope.join(10s));
    EXPECT_TRUE(got == data);
  });
}

// The peer never reads: once the kernel buffers are full the write makes no progress, and it
// must fail with errc::timeout within write_timeout (not hang), resetting the connection.
TEST(TcpStream, WriteToPeerThatNeverReadsTimesOut) {
  asio::io_context io;
  auto [a, b] = test::tcp_pair(io);
  a->set_write_timeout(300ms);
  test::run_with_deadline(
      io,
      [&, a = a]() -> awaitable<void> {
        Bytes chunk(1 << 20);
        const auto start = Clock::now();
        result<void> r = success();
        std::size_t written = 0;
        // Far more than any socket buffer; the loop ends only by the timeout.
        for (int i = 0; i < 4096; ++i) {
          auto w = co_await a->write(chunk);
          if (!w) {
            r = w.error();
            break;
          }
          written += chunk.size();
        }
        const auto took = Clock::now() - start;
        CO_ASSERT_FALSE(r);
        EXPECT_EQ(r.error(), errc::timeout) << r.error().message();
        EXPECT_NE(r.error().message().find("peer took no bytes"), std::string::npos)
            << r.error().message();
        EXPECT_LT(written, std::size_t{1} << 31);
        EXPECT_GE(took, 300ms);
        EXPECT_LT(took, 5s);
        // The connection was closed: further writes fail at once.
        auto again = co_await a->write(chunk);
        EXPECT_FALSE(again);
      },
      20s);
}

TEST(TcpStream, ZeroWriteTimeoutMeansNoDeadline) {
  asio::io_context io;
  auto [a, b] = test::tcp_pair(io);
  a->set_write_timeout(Duration::zero());
  test::run_with_deadline(io, [&, a = a]() -> awaitable<void> {
    Bytes chunk(1 << 20);
    // Without a deadline the write waits for the peer: bounded here only by our own timeout.
    result<void> r = success();
    for (int i = 0; i < 4096; ++i) {
      auto w = co_await with_timeout(a->write(chunk), 500ms, "w");
      if (!w) {
        r = w.error();
        break;
      }
    }
    CO_ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), errc::timeout);
    EXPECT_EQ(r.error().message().find("peer took no bytes"), std::string::npos);
  });
}

// DCUtR needs dials that leave from the listening port: listeners set SO_REUSEADDR and
// SO_REUSEPORT, and tcp_connect_from binds the dial socket to the listener's endpoint.
TEST(TcpStream, ConnectFromListeningPort) {
  asio::io_context io;
  auto listener = [&] {
    asio::ip::tcp::acceptor acc(io);
    std::error_code ec;
    acc.open(asio::ip::tcp::v4(), ec);
    set_reuse_port(acc, ec);
    EXPECT_FALSE(ec) << ec.message();
    acc.bind({asio::ip::make_address("127.0.0.1"), 0}, ec);
    acc.listen(16, ec);
    EXPECT_FALSE(ec) << ec.message();
    return acc;
  };
  auto a = listener(), b = listener();
  const auto a_ep = a.local_endpoint(), b_ep = b.local_endpoint();
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    auto s = co_await tcp_connect_from(b_ep, a_ep, 5s);
    CO_ASSERT_OK(s);
    EXPECT_EQ(s.value()->local_endpoint(), a_ep);  // left from A's listening port
    auto [ec, peer] = co_await b.async_accept(use_nothrow);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(peer.remote_endpoint(), a_ep);
    // A second dial from the same port to the same peer is the same 4-tuple: refused.
    auto again = co_await tcp_connect_from(b_ep, a_ep, 5s);
    EXPECT_FALSE(again);
  });
}
