// Yamux flow control bookkeeping (pure, no I/O; time is a parameter): the receive window of
// a stream with window auto-tuning, the send credit granted by the peer, and the session's
// memory budget for grown windows. One instance per stream, used from the session's thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "starling/core/async.hpp"
#include "starling/core/result.hpp"

namespace starling::net::yamux {

// Bytes of window growth (above the configured initial window) a session may hand out.
class WindowBudget {
 public:
  explicit WindowBudget(std::size_t limit) : limit_(limit) {}
  bool try_reserve(std::size_t n) noexcept {
    if (n > limit_ - used_) return false;
    used_ += n;
    return true;
  }
  void release(std::size_t n) noexcept { used_ -= n < used_ ? n : used_; }
  std::size_t used() const noexcept { return used_; }
  std::size_t limit() const noexcept { return limit_; }

 private:
  std::size_t limit_;
  std::size_t used_ = 0;
};

struct AutoTune {
  bool enabled = true;
  std::uint32_t max_window = 16 * 1024 * 1024;
};

// Receive side of one stream. Invariant: credit + held + pending == window, where credit is
// what the peer may still send, held is received-but-unread, pending is read by the
// application but not yet returned to the peer by a window update.
class RecvWindow {
 public:
  // `window`: the window we intend to grant (>= kInitialWindow). The peer starts out
  // assuming kInitialWindow; the difference goes out with the first (forced) update.
  RecvWindow(std::uint32_t window, TimePoint now);

  // A data frame of `n` bytes arrived. False (state unchanged) if it exceeds the credit.
  bool on_data(std::uint32_t n) noexcept;
  // The application consumed `n` held bytes.
  void on_consumed(std::size_t n) noexcept;
  // True when half the window has been consumed and not yet returned.
  bool update_due() const noexcept { return pending() * 2 >= window_; }
  // The window-update delta to send now (0: nothing to send). `force` sends whatever is
  // owed even below the half-window threshold (SYN/ACK frames). Auto-tuning: the sender is
  // window-limited if the last update was less than two RTTs ago, or if it used up all its
  // credit while the application kept up (at most half the window unread: the sender was
  // waiting for our update, not for our reader); then the window doubles (up to
  // tune.max_window, if `budget` can cover the growth). The second rule needs no RTT sample,
  // so it also works when queues inflate the RTT under load or the RTT is tiny (loopback).
  std::uint32_t take_update(TimePoint now, Duration rtt, const AutoTune& tune, WindowBudget& budget,
                            bool force) noexcept;

  std::uint32_t window() const noexcept { return static_cast<std::uint32_t>(window_); }
  std::uint32_t credit() const noexcept { return static_cast<std::uint32_t>(credit_); }
  std::uint64_t held() const noexcept { return held_; }
  std::uint64_t pending() const noexcept { return window_ - credit_ - held_; }
  // Window growth reserved from the budget (to release when the stream goes away).
  std::uint64_t grown() const noexcept { return window_ - base_; }
  std::uint64_t growths() const noexcept { return growths_; }

 private:
  std::uint64_t base_;    // window before any auto-tuning
  std::uint64_t window_;  // current window
  std::uint64_t credit_;  // what the peer may still send
  std::uint64_t held_ = 0;
  std::uint64_t growths_ = 0;
  bool starved_ = false;  // the peer ran out of credit while we kept up, since the last update
  TimePoint last_update_;
};

// Send side of one stream: credit granted by the peer's window updates.
class SendWindow {
 public:
  SendWindow();
  // Adds a window-update delta; errc::protocol_violation if the window would exceed 2^32-1.
  result<void> on_update(std::uint32_t delta);
  std::uint64_t credit() const noexcept { return credit_; }
  void consume(std::size_t n) noexcept { credit_ -= n; }

 private:
  std::uint64_t credit_;
};

}  // namespace starling::net::yamux
