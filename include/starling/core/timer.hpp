// starling::Timer: an asio waitable timer on starling::Clock (core/clock.hpp). Once a test has
// enabled clock jumps, the reactor wakes at least every 2 ms to look at the (possibly moved)
// clock; otherwise it sleeps until the earliest expiry, as asio::steady_timer does.
#pragma once

#include <algorithm>

#include <asio/basic_waitable_timer.hpp>

#include "starling/core/clock.hpp"

namespace starling {

struct ClockWaitTraits {
  static constexpr Duration jump_poll = std::chrono::milliseconds(2);

  static Duration to_wait_duration(const Duration& d) {
    return clock_jumps_enabled() ? std::min(d, jump_poll) : d;
  }
  static Duration to_wait_duration(const TimePoint& t) {
    const TimePoint now = Clock::now();
    if (t <= now) return Duration::zero();
    // t - now overflows only for a negative now (the steady clock counts from boot: never).
    if (now.time_since_epoch() < Duration::zero()) return to_wait_duration(Duration::max());
    return to_wait_duration(t - now);
  }
};

using Timer = asio::basic_waitable_timer<Clock, ClockWaitTraits>;

}  // namespace starling
