// The clocks every module uses, without asio: the protocol cores (DHT, matchmaking, all-reduce,
// progress) take time as values of these types and never read a clock themselves.
//
// - Clock (steady): deadlines, timeouts, rates. Never goes back. It is the steady clock plus a
//   process-wide offset that only tests move (advance_clock): every deadline, timer
//   (starling::Timer, core/timer.hpp) and rate in the process then sees the time jump, so a
//   test of a 10 s deadline waits for no 10 s and no deadline of a test expires from load.
// - WallClock (system): only what must mean the same on every peer (record versions and
//   expirations, signature windows, matchmaking deadlines published in the DHT).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace starling {

struct Clock {
  using base = std::chrono::steady_clock;
  using duration = base::duration;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<Clock, duration>;
  static constexpr bool is_steady = true;

  static time_point now() noexcept {
    return time_point(base::now().time_since_epoch() +
                      std::chrono::nanoseconds(offset_ns.load(std::memory_order_relaxed)));
  }

  // Moved only by advance_clock() (tests).
  static inline std::atomic<std::int64_t> offset_ns{0};
  static inline std::atomic<bool> jumps{false};
};

using Duration = Clock::duration;
using TimePoint = Clock::time_point;

using WallClock = std::chrono::system_clock;
using WallTime = WallClock::time_point;

using Millis = std::chrono::milliseconds;

using namespace std::chrono_literals;

// Tests only: moves Clock forward by `d` for the whole process (never back). Timers notice the
// jump within a few milliseconds (core/timer.hpp); threads blocked on a condition variable
// notice it at their next wake-up.
inline void advance_clock(Duration d) noexcept {
  if (d <= Duration::zero()) return;
  Clock::jumps.store(true, std::memory_order_relaxed);
  Clock::offset_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(),
                             std::memory_order_relaxed);
}

// True once advance_clock() has been called (or enable_clock_jumps(), which tests call before
// they create the timers whose jumps they expect).
inline bool clock_jumps_enabled() noexcept {
  return Clock::jumps.load(std::memory_order_relaxed);
}
inline void enable_clock_jumps() noexcept {
  Clock::jumps.store(true, std::memory_order_relaxed);
}

}  // namespace starling
