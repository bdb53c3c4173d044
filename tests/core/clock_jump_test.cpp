// starling::Clock jumps (advance_clock): timers, sleeps and deadlines on the moved clock end at
// the jump, not after the real duration; nothing ends before it.
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "starling/core/blocking.hpp"
#include "starling/core/timer.hpp"

using namespace starling;

namespace {
Duration real_since(Clock::base::time_point t0) {
  return std::chrono::duration_cast<Duration>(Clock::base::now() - t0);
}
}  // namespace

TEST(ClockJump, NeverGoesBackAndMovesByTheJump) {
  const auto t0 = Clock::now();
  const auto r0 = Clock::base::now();
  advance_clock(-5s);  // ignored
  EXPECT_GE(Clock::now(), t0);
  advance_clock(3h);
  const auto moved = Clock::now() - t0;
  EXPECT_GE(moved, 3h);
  EXPECT_LE(moved, 3h + real_since(r0) + 1ms);
}

TEST(ClockJump, SleepsTimeoutsAndTimersEndAtTheJump) {
  enable_clock_jumps();
  IoThread io("clock-jump");
  const auto r0 = Clock::base::now();
  const auto t0 = Clock::now();
  auto r = block_on(
      io.executor(),
      [&]() -> awaitable<result<int>> {
        auto ex = co_await asio::this_coro::executor;
        AsyncEvent waiting(ex);
        bool timer_fired = false;
        Timer timer(ex, 2h);
        timer.async_wait([&](std::error_code ec) { timer_fired = !ec; });
        // An operation that would take a day, bounded by a deadline of an hour.
        asio::co_spawn(
            ex,
            [&]() -> awaitable<void> {
              co_await waiting.wait();
              EXPECT_FALSE(timer_fired);
              advance_clock(1h);
            },
            asio::detached);
        waiting.set();
        auto slept = co_await with_timeout(
            []() -> awaitable<result<void>> { co_return co_await sleep_for(24h); }(), 1h,
            "a day's work");
        EXPECT_FALSE(slept);
        if (!slept) {
          EXPECT_EQ(slept.error(), errc::timeout);
        }
        EXPECT_FALSE(timer_fired);  // 2 h not reached yet
        advance_clock(1h);
        auto s = co_await sleep_for(10ms);  // the 2 h timer fires meanwhile
        EXPECT_TRUE(s);
        for (int i = 0; i < 100 && !timer_fired; ++i) (void)co_await sleep_for(1ms);
        EXPECT_TRUE(timer_fired);
        co_return 0;
      },
      30s);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_GE(Clock::now() - t0, 2h);
  // Hours of clock time in a fraction of real time (generous: a loaded machine).
  EXPECT_LT(real_since(r0), 20s);
}
