#include "net/yamux_flow.hpp"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "net/yamux_frame.hpp"

namespace starling::net::yamux {

RecvWindow::RecvWindow(std::uint32_t window, TimePoint now)
    : base_(std::max(window, kInitialWindow)),
      window_(base_),
      credit_(kInitialWindow),
      last_update_(now) {}

bool RecvWindow::on_data(std::uint32_t n) noexcept {
  if (n > credit_) return false;
  credit_ -= n;
  held_ += n;
  if (credit_ == 0 && held_ * 2 <= window_) starved_ = true;
  return true;
}

void RecvWindow::on_consumed(std::size_t n) noexcept {
  held_ -= std::min<std::uint64_t>(n, held_);
}

std::uint32_t RecvWindow::take_update(TimePoint now, Duration rtt, const AutoTune& tune,
                                      WindowBudget& budget, bool force) noexcept {
  if (!force && !update_due()) return 0;
  const bool fast_updates = rtt > Duration::zero() && now - last_update_ < 2 * rtt;
  if (!force && tune.enabled && (fast_updates || starved_) && window_ < tune.max_window) {
    const std::uint64_t grown = std::min<std::uint64_t>(window_ * 2, tune.max_window);
    if (grown > window_ && budget.try_reserve(grown - window_)) {
      window_ = grown;
      ++growths_;
    }
  }
  last_update_ = now;
  if (!force) starved_ = false;
  const std::uint64_t delta = window_ - credit_ - held_;
  credit_ += delta;
  return static_cast<std::uint32_t>(delta);
}

SendWindow::SendWindow() : credit_(kInitialWindow) {}

result<void> SendWindow::on_update(std::uint32_t delta) {
  if (credit_ + delta > std::numeric_limits<std::uint32_t>::max())
    return make_error(
        errc::protocol_violation,
        fmt::format("window update of {} overflows a send window of {}", delta, credit_));
  credit_ += delta;
  return success();
}

}  // namespace starling::net::yamux
