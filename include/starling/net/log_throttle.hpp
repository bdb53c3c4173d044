// LogThrottle: lets a repeated warning (refused connections, refused calls) be logged at most
// once per interval, with the number of occurrences folded into the line, so a flooding peer
// cannot flood the log too.
//
// Threading rule: plain state, no locks; owned by one executor's object.
#pragma once

#include <cstdint>

#include "starling/core/async.hpp"

namespace starling::net {

class LogThrottle {
 public:
  explicit LogThrottle(Duration interval) : interval_(interval) {}
  // Counts one occurrence. Returns how many occurred since the last logged line (this one
  // included) when a line should be logged now, else 0.
  std::uint64_t note(TimePoint now) {
    ++pending_;
    if (logged_once_ && now - last_ < interval_) return 0;
    logged_once_ = true;
    last_ = now;
    const auto n = pending_;
    pending_ = 0;
    return n;
  }

 private:
  Duration interval_;
  TimePoint last_{};
  bool logged_once_ = false;
  std::uint64_t pending_ = 0;
};

}  // namespace starling::net
