// A plain timer started beside a timed operation on the same executor. How late the executor
// ran it is the scheduling delay of a loaded machine, which a deadline test must not blame on
// the code under test: bound an operation's duration by `ref.elapsed() + margin` instead of
// `deadline + margin`. A hung or late operation still fails; a descheduled test thread does not.
#pragma once

#include <asio/any_io_executor.hpp>
#include "starling/core/timer.hpp"

#include <memory>
#include <optional>

#include "starling/core/async.hpp"

namespace starling::test {

class ReferenceTimer {
 public:
  ReferenceTimer(const asio::any_io_executor& ex, Duration d)
      : start_(Clock::now()), d_(d), fired_(std::make_shared<std::optional<TimePoint>>()) {
    timer_ = std::make_shared<Timer>(ex, d);
    timer_->async_wait([f = fired_](std::error_code ec) {
      if (!ec) *f = Clock::now();
    });
  }
  // From construction until the timer's handler ran; the nominal duration if it has not run.
  Duration elapsed() const { return *fired_ ? **fired_ - start_ : d_; }

 private:
  TimePoint start_;
  Duration d_;
  std::shared_ptr<std::optional<TimePoint>> fired_;
  std::shared_ptr<Timer> timer_;
};

}  // namespace starling::test
