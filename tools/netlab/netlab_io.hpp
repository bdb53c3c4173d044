// Small asio helpers shared by the netlab test tools (starling-delay-proxy, starling-netprobe):
// endpoint parsing, a timer-based wakeup event, sleeping and connecting with a deadline.
//
// Threading rule: every object belongs to one io_context run by a single thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

namespace netlab {

using Clock = std::chrono::steady_clock;
using Duration = Clock::duration;
using TimePoint = Clock::time_point;
using tcp = asio::ip::tcp;
template <class T>
using awaitable = asio::awaitable<T>;

inline constexpr auto use_nothrow = asio::experimental::as_tuple(asio::use_awaitable);

inline Duration ms(double v) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double, std::milli>(v));
}
inline double to_ms(Duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// Parses "A.B.C.D:PORT" or "[v6]:PORT" (numeric addresses only).
inline std::optional<tcp::endpoint> parse_endpoint(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= s.size()) return std::nullopt;
  std::string host = s.substr(0, colon);
  std::string port_s = s.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  unsigned long port = 0;
  for (char c : port_s) {
    if (c < '0' || c > '9') return std::nullopt;
    port = port * 10 + static_cast<unsigned long>(c - '0');
    if (port > 65535) return std::nullopt;
  }
  std::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (ec) return std::nullopt;
  return tcp::endpoint(addr, static_cast<std::uint16_t>(port));
}

inline std::string to_string(const tcp::endpoint& ep) {
  if (ep.address().is_v6())
    return "[" + ep.address().to_string() + "]:" + std::to_string(ep.port());
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

// A level-triggered wakeup built on a steady_timer: wait() blocks until set() or until the
// waiting operation is cancelled (asio per-operation cancellation) or cancel_all() is called.
class Event {
 public:
  explicit Event(asio::any_io_executor ex) : timer_(ex, TimePoint::max()) {}
  void set() {
    set_ = true;
    timer_.cancel();
  }
  void reset() { set_ = false; }
  bool is_set() const { return set_; }
  // Wakes waiters without leaving the flag set.
  void pulse() { timer_.cancel(); }
  awaitable<void> wait() {
    if (set_) co_return;
    timer_.expires_at(TimePoint::max());
    co_await timer_.async_wait(use_nothrow);
  }

 private:
  asio::steady_timer timer_;
  bool set_ = false;
};

// Sleeps until `t` on a timer owned by the caller (so the caller can cancel it).
inline awaitable<bool> sleep_until(asio::steady_timer& timer, TimePoint t) {
  if (Clock::now() >= t) co_return true;
  timer.expires_at(t);
  auto [ec] = co_await timer.async_wait(use_nothrow);
  co_return !ec;
}

// Connects `sock` (already open or not) to `ep` within `timeout`. Returns the error, or
// asio::error::timed_out.
inline awaitable<std::error_code> connect_with_timeout(tcp::socket& sock, const tcp::endpoint& ep,
                                                       Duration timeout) {
  using namespace asio::experimental::awaitable_operators;
  asio::steady_timer timer(co_await asio::this_coro::executor, timeout);
  auto r = co_await (sock.async_connect(ep, use_nothrow) || timer.async_wait(use_nothrow));
  if (r.index() == 0) co_return std::get<0>(std::get<0>(r));
  co_return asio::error::timed_out;
}

// Closes a socket so that the peer sees a reset (RST) instead of an orderly FIN.
inline void reset_socket(tcp::socket& s) {
  std::error_code ec;
  if (!s.is_open()) return;
  s.set_option(asio::socket_base::linger(true, 0), ec);
  s.close(ec);
}

inline void close_socket(tcp::socket& s) {
  std::error_code ec;
  if (s.is_open()) s.close(ec);
}

}  // namespace netlab
