// block_on() and IoThread: results and errors cross threads, timeouts cancel the operation and
// wait (bounded) for it to unwind, the io thread itself is refused, stop() is bounded.
#include <gtest/gtest.h>

#include <atomic>
#include <future>

#include <asio/post.hpp>
#include <asio/strand.hpp>

#include "starling/core/blocking.hpp"

using namespace starling;

TEST(BlockOn, ReturnsValueAndError) {
  IoThread io("blk-test");
  auto v = block_on(
      io.executor(),
      []() -> awaitable<result<int>> {
        (void)co_await sleep_for(5ms);
        co_return 42;
      },
      5s);
  ASSERT_TRUE(v) << v.error().message();
  EXPECT_EQ(v.value(), 42);

  auto e = block_on(
      io.executor(),
      []() -> awaitable<result<std::string>> {
        co_return make_error(errc::not_found, "nothing here");
      },
      5s);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error(), errc::not_found);
  EXPECT_EQ(e.error().context(), "nothing here");

  auto vd = block_on(
      io.executor(), []() -> awaitable<result<void>> { co_return success(); }, 5s);
  EXPECT_TRUE(vd);
}

TEST(BlockOn, RunsOnTheExecutorThread) {
  IoThread io("blk-test");
  auto caller = std::this_thread::get_id();
  auto ran_on = block_on(
      io.executor(),
      [&]() -> awaitable<result<std::thread::id>> { co_return std::this_thread::get_id(); }, 5s);
  ASSERT_TRUE(ran_on);
  EXPECT_NE(ran_on.value(), caller);
}

TEST(BlockOn, TimeoutCancelsAndWaitsForUnwind) {
  IoThread io("blk-test");
  auto unwound = std::make_shared<std::atomic<bool>>(false);
  auto t0 = Clock::now();
  auto r = block_on(
      io.executor(),
      [unwound]() -> awaitable<result<int>> {
        auto slept = co_await sleep_for(1h);
        if (!slept) {
          unwound->store(true);  // saw the cancellation
          co_return slept.error();
        }
        co_return 1;
      },
      100ms);
  auto took = Clock::now() - t0;
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::timeout);
  EXPECT_GE(took, 100ms);
  EXPECT_LT(took, 1s);
  // block_on returned only after the operation unwound.
  EXPECT_TRUE(unwound->load());
}

TEST(BlockOn, InterruptEndsTheWaitAndCancels) {
  IoThread io("blk-test");
  auto unwound = std::make_shared<std::atomic<bool>>(false);
  std::atomic<int> asked{0};
  const auto t0 = Clock::now();
  // The interrupt says yes from its 5th question on (~100 ms at the default 20 ms poll).
  Interrupt interrupt{[&] { return ++asked >= 5; }};
  auto r = block_on(
      io.executor(),
      [unwound]() -> awaitable<result<int>> {
        auto slept = co_await sleep_for(1h);
        if (!slept) unwound->store(true);
        co_return 1;
      },
      1h, 2s, interrupt);
  const auto took = Clock::now() - t0;
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::cancelled);
  EXPECT_GE(asked.load(), 5);
  EXPECT_GE(took, 80ms);
  EXPECT_LT(took, 5s);
  EXPECT_TRUE(unwound->load());  // cancelled, and waited for

  // An interrupt that never fires changes nothing: the value, in time.
  Interrupt never{[] { return false; }};
  auto v = block_on(
      io.executor(),
      []() -> awaitable<result<int>> {
        (void)co_await sleep_for(60ms);
        co_return 7;
      },
      5s, 2s, never);
  ASSERT_TRUE(v) << v.error().message();
  EXPECT_EQ(v.value(), 7);
}

TEST(BlockOn, AbandonsOperationThatIgnoresCancellationAfterBound) {
  IoThread io("blk-test");
  auto finished = std::make_shared<std::atomic<bool>>(false);
  auto t0 = Clock::now();
  // Blocks the io thread for 600 ms (ignores cancellation entirely).
  auto r = block_on(
      io.executor(),
      [finished]() -> awaitable<result<int>> {
        std::this_thread::sleep_for(600ms);
        finished->store(true);
        co_return 1;
      },
      50ms, /*unwind=*/50ms);
  auto took = Clock::now() - t0;
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::timeout);
  EXPECT_NE(r.error().context().find("did not unwind"), std::string::npos);
  EXPECT_LT(took, 500ms);
  EXPECT_FALSE(finished->load());
  // The abandoned operation still finishes safely later (it owns its state).
  EXPECT_TRUE(io.stop(3s));
  EXPECT_TRUE(finished->load());
}

TEST(BlockOn, RefusedOnTheExecutorsOwnThread) {
  IoThread io("blk-test");
  std::promise<result<int>> p;
  asio::post(io.executor(), [&] {
    p.set_value(block_on(
        io.executor(), []() -> awaitable<result<int>> { co_return 1; }, 1s));
  });
  auto f = p.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  auto r = f.get();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::internal);

  // Also through a strand of the same io_context.
  auto strand = asio::make_strand(io.context());
  std::promise<result<int>> p2;
  asio::post(strand, [&] {
    p2.set_value(block_on(
        io.executor(), []() -> awaitable<result<int>> { co_return 1; }, 1s));
  });
  auto f2 = p2.get_future();
  ASSERT_EQ(f2.wait_for(5s), std::future_status::ready);
  auto r2 = f2.get();
  ASSERT_FALSE(r2);
  EXPECT_EQ(r2.error(), errc::internal);
}

TEST(BlockOn, ExceptionBecomesInternal) {
  IoThread io("blk-test");
  auto r = block_on(
      io.executor(),
      []() -> awaitable<result<int>> {
        throw std::runtime_error("kaboom");
        co_return 0;
      },
      5s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::internal);
  EXPECT_NE(r.error().context().find("kaboom"), std::string::npos);
}

TEST(BlockOn, NoExecutorIsInvalidArgument) {
  auto r = block_on(
      asio::any_io_executor{}, []() -> awaitable<result<int>> { co_return 1; }, 1s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::invalid_argument);
}

TEST(BlockOn, StoppedContextTimesOut) {
  asio::io_context io;  // never run
  auto t0 = Clock::now();
  auto r = block_on(
      io.get_executor(), []() -> awaitable<result<int>> { co_return 1; }, 50ms, 50ms);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::timeout);
  EXPECT_LT(Clock::now() - t0, 1s);
}

TEST(BlockOn, ManyThreadsAtOnce) {
  IoThread io("blk-test");
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        auto r = block_on(
            io.executor(), [t, i]() -> awaitable<result<int>> { co_return t * 1000 + i; }, 5s);
        if (r && r.value() == t * 1000 + i) ++ok;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 400);
}

TEST(IoThread, StopIsBoundedWithPendingWork) {
  IoThread io("blk-test");
  Timer forever(io.context(), TimePoint::max());
  forever.async_wait([](std::error_code) {});
  auto t0 = Clock::now();
  auto r = io.stop(100ms);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::timeout);
  EXPECT_LT(Clock::now() - t0, 1s);
  EXPECT_TRUE(io.stopped());
  EXPECT_TRUE(io.stop());  // idempotent
}

TEST(IoThread, StopDrainsQueuedWork) {
  IoThread io("blk-test");
  std::atomic<int> ran{0};
  for (int i = 0; i < 100; ++i) asio::post(io.executor(), [&] { ++ran; });
  EXPECT_TRUE(io.stop(2s));
  EXPECT_EQ(ran.load(), 100);
}

TEST(IoThread, StopFromIoThreadOnlyRequestsIt) {
  IoThread io("blk-test");
  std::promise<result<void>> p;
  asio::post(io.executor(), [&] { p.set_value(io.stop()); });
  auto f = p.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  auto r = f.get();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::internal);
  // The owner's stop() then joins.
  EXPECT_TRUE(io.stop(1s));
}

TEST(IoThread, HandlerExceptionDoesNotKillTheThread) {
  IoThread io("blk-test");
  asio::post(io.executor(), [] { throw std::runtime_error("handler blew up"); });
  auto r = block_on(
      io.executor(), []() -> awaitable<result<int>> { co_return 7; }, 5s);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value(), 7);
}
