#include <gtest/gtest.h>

#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include "starling/core/async.hpp"
#include "starling/core/bytes.hpp"

using namespace starling;

TEST(Varint, RoundTripAndRejections) {
  for (std::uint64_t v : {0ull, 1ull, 127ull, 128ull, 300ull, 16384ull, (1ull << 63) - 1}) {
    Bytes b;
    append_uvarint(b, v);
    EXPECT_EQ(b.size(), uvarint_size(v));
    auto d = decode_uvarint(b);
    ASSERT_TRUE(d && d.value());
    EXPECT_EQ(d.value()->value, v);
    EXPECT_EQ(d.value()->length, b.size());
  }
  Bytes nonminimal{0x80, 0x00};
  EXPECT_FALSE(decode_uvarint(nonminimal));
  Bytes partial{0x80, 0x80};
  auto p = decode_uvarint(partial);
  ASSERT_TRUE(p);
  EXPECT_FALSE(p.value().has_value());
  Bytes toolong(10, 0x81);
  EXPECT_FALSE(decode_uvarint(toolong));
}

TEST(BigEndian, KnownBytesAndRoundTrip) {
  Bytes b;
  append_be16(b, 0x0102);
  append_be32(b, 0x03040506u);
  append_be64(b, 0x0708090a0b0c0d0eull);
  EXPECT_EQ(to_hex(b), "0102030405060708090a0b0c0d0e");
  EXPECT_EQ(load_be16(b.data()), 0x0102);
  EXPECT_EQ(load_be32(b.data() + 2), 0x03040506u);
  EXPECT_EQ(load_be64(b.data() + 6), 0x0708090a0b0c0d0eull);
  for (std::uint64_t v : {0ull, 1ull, 0xffull << 56, ~0ull}) {
    Bytes e;
    append_be64(e, v);
    ASSERT_EQ(e.size(), 8u);
    EXPECT_EQ(load_be64(e.data()), v);
  }
}

TEST(Hex, RoundTrip) {
  Bytes b{0x00, 0xab, 0xff};
  EXPECT_EQ(to_hex(b), "00abff");
  EXPECT_EQ(from_hex("00ABff").value(), b);
  EXPECT_FALSE(from_hex("0g"));
  EXPECT_FALSE(from_hex("abc"));
}

TEST(Error, ContextAndCode) {
  Error e(errc::timeout, "dial peer");
  EXPECT_EQ(e, errc::timeout);
  EXPECT_EQ(e.message(), "dial peer: timed out");
  EXPECT_EQ(e.with_context("outer").message(), "outer: dial peer: timed out");
  result<int> r = make_error(errc::closed);
  EXPECT_FALSE(r);
  EXPECT_THROW((void)r.value(), std::system_error);
}

TEST(Async, WithTimeoutCancelsSlowOperation) {
  asio::io_context io;
  result<int> out = 0;
  asio::co_spawn(
      io,
      [&]() -> awaitable<void> {
        auto slow = []() -> awaitable<result<int>> {
          ST_CO_TRY(co_await sleep_for(10s));
          co_return 1;
        };
        out = co_await with_timeout(slow(), 20ms, "slow op");
      },
      asio::detached);
  auto t0 = Clock::now();
  io.run();
  EXPECT_LT(Clock::now() - t0, 2s);
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error(), errc::timeout);
}

// An operation that needs a few executor turns to unwind after cancellation (as a dial
// through several layers does): the deadline's timer completes first, and the result must
// still say "cancelled", not "timeout", so callers stop instead of retrying.
TEST(Async, WithTimeoutReportsCancellationFromOutsideAsCancelled) {
  asio::io_context io;
  result<int> inner = 0, outer = 0;
  asio::co_spawn(
      io,
      [&]() -> awaitable<void> {
        auto slow_to_unwind = []() -> awaitable<result<int>> {
          auto r = co_await sleep_for(10s);
          co_await asio::this_coro::reset_cancellation_state();
          for (int i = 0; i < 3; ++i) co_await asio::post(asio::use_awaitable);
          if (!r) co_return r.error();
          co_return 1;
        };
        auto wrapped = [&]() -> awaitable<result<int>> {
          inner = co_await with_timeout(slow_to_unwind(), 10s, "inner op");
          co_return inner;
        };
        outer = co_await with_timeout(wrapped(), 20ms, "outer deadline");
      },
      asio::detached);
  auto t0 = Clock::now();
  io.run();
  EXPECT_LT(Clock::now() - t0, 2s);
  ASSERT_FALSE(inner);
  EXPECT_EQ(inner.error(), errc::cancelled) << inner.error().message();
  ASSERT_FALSE(outer);
  EXPECT_EQ(outer.error(), errc::timeout);
}

TEST(Async, TaskScopeCloseIsBounded) {
  asio::io_context io;
  TaskScope scope(io.get_executor());
  int finished = 0;
  for (int i = 0; i < 5; ++i)
    scope.spawn([&]() -> awaitable<void> {
      (void)co_await sleep_for(1h);
      ++finished;
    });
  result<void> closed = make_error(errc::internal);
  asio::co_spawn(
      io, [&]() -> awaitable<void> { closed = co_await scope.close(2s); }, asio::detached);
  auto t0 = Clock::now();
  io.run();
  EXPECT_TRUE(closed) << closed.error().message();
  EXPECT_EQ(finished, 5);
  EXPECT_EQ(scope.active(), 0u);
  EXPECT_LT(Clock::now() - t0, 2s);
}

TEST(Async, EventWakesWaiters) {
  asio::io_context io;
  AsyncEvent ev(io.get_executor());
  int woke = 0;
  for (int i = 0; i < 3; ++i)
    asio::co_spawn(
        io,
        [&]() -> awaitable<void> {
          if (co_await ev.wait()) ++woke;
        },
        asio::detached);
  asio::co_spawn(
      io,
      [&]() -> awaitable<void> {
        (void)co_await sleep_for(5ms);
        ev.set();
      },
      asio::detached);
  io.run();
  EXPECT_EQ(woke, 3);
}
