// Coroutine helpers on asio: non-throwing completion tokens, error mapping, deadlines,
// an awaitable event, and TaskScope (structured background tasks with bounded shutdown).
//
// Threading rule: every object here belongs to one executor (the node's io_context, run by
// one thread) and must be used only from coroutines/handlers running on it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include "starling/core/timer.hpp"

#include "starling/core/clock.hpp"
#include "starling/core/result.hpp"

namespace starling {

template <class T>
using awaitable = asio::awaitable<T>;

// Completion token: co_await op(..., use_nothrow) yields std::tuple<error_code, ...>.
inline constexpr auto use_nothrow = asio::experimental::as_tuple(asio::use_awaitable);

// Maps an asio/system error to a starling Error with context.
Error from_asio(const std::error_code& ec, std::string context = {});

// Runs `op` with a deadline. If the deadline passes first, `op` is cancelled and the
// result is errc::timeout with `what` as context. If the caller is cancelled, the result is
// errc::cancelled whichever of the two branches unwinds first (callers stop on cancelled but
// may retry on timeout).
template <class T>
awaitable<result<T>> with_timeout(awaitable<result<T>> op, Duration timeout, std::string what) {
  using namespace asio::experimental::awaitable_operators;
  Timer timer(co_await asio::this_coro::executor, timeout);
  auto r = co_await (std::move(op) || timer.async_wait(use_nothrow));
  if (r.index() == 0) co_return std::move(std::get<0>(r));
  // The timer only completes with an error when the group was cancelled from outside.
  if (std::get<0>(std::get<1>(r))) co_return make_error(errc::cancelled, std::move(what));
  co_return make_error(errc::timeout, std::move(what));
}

// Sleeps; returns errc::cancelled if cancelled.
awaitable<result<void>> sleep_for(Duration d);

// A level-triggered notification: waiters block until notify_all() (or cancellation).
// wait() returns immediately if notified since the last reset().
class AsyncEvent {
 public:
  explicit AsyncEvent(asio::any_io_executor ex);
  // Completes when the event is set; errc::cancelled if the waiting coroutine was cancelled.
  awaitable<result<void>> wait();
  void set();    // wakes every waiter; later waits complete at once until reset()
  void reset();  // clears the flag
  // Wakes current waiters without leaving the flag set (edge trigger).
  void pulse();
  bool is_set() const noexcept { return set_; }

 private:
  Timer timer_;
  bool set_ = false;
};

// Runs background coroutines and can stop them all: close() cancels every task and waits
// (bounded by `timeout`) for each to finish. Tasks must react to cancellation.
class TaskScope {
 public:
  explicit TaskScope(asio::any_io_executor ex);
  ~TaskScope();  // cancels remaining tasks, no wait (close() waits); none on a stopped context
  TaskScope(const TaskScope&) = delete;
  TaskScope& operator=(const TaskScope&) = delete;

  // Starts `task` on the scope's executor. Ignored (task not started) after close().
  void spawn(awaitable<void> task);
  // Starts `fn()` where fn is a callable returning awaitable<void> (e.g. a lambda with
  // captures). The callable is kept alive inside the task's frame, so capturing lambdas are
  // safe here; never write spawn([&]() -> awaitable<void> {...}()) — the invoked lambda's
  // captures die with the temporary closure while the coroutine still runs.
  template <class F>
  requires std::is_invocable_r_v<awaitable<void>, F&> void spawn(F fn) {
    spawn([](F f) -> awaitable<void> { co_await f(); }(std::move(fn)));
  }
  std::size_t active() const noexcept;
  bool closed() const noexcept;

  // Cancels every task and waits until all have finished or `timeout` passes.
  // Returns errc::timeout if some task did not finish in time.
  awaitable<result<void>> close(Duration timeout = 5s);
  // Waits (without cancelling) until every task has finished or `timeout` passes.
  awaitable<result<void>> join(Duration timeout);

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with running tasks so they can outlive the scope
};

}  // namespace starling
