// Blocking facade for code that does not run on a node's io thread (training loops, CLI
// tools): block_on() runs an awaitable on a given executor and waits for it with a timeout;
// IoThread owns an io_context and the one thread that runs it.
//
// Threading rule: block_on() is for threads that do NOT run the target executor; called on
// the executor's own thread it refuses with errc::internal instead of deadlocking. The
// operation itself runs on the executor, like any other coroutine of that node. IoThread's
// methods may be called from any thread; stop() from the io thread only requests the stop.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>

#include <asio/any_io_executor.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

#include "starling/core/async.hpp"
#include "starling/core/result.hpp"

namespace starling {

namespace detail {

template <class A>
struct awaitable_result;
template <class T>
struct awaitable_result<awaitable<result<T>>> {
  using type = T;
};

struct BlockOnState {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;                 // the coroutine finished (guarded by mutex)
  asio::cancellation_signal signal;  // emitted only on the executor
};
template <class T>
struct BlockOnSlot : BlockOnState {
  std::optional<result<T>> value;  // guarded by mutex
};

// True if the calling thread is running `ex`'s execution context (io_context / thread_pool,
// possibly through a strand). False for executor types it does not know.
bool running_in_executor_thread(const asio::any_io_executor& ex);
// Waits until st.done or for `d` (saturating: a huge `d` never overflows); returns st.done.
bool wait_done_for(BlockOnState& st, Duration d);
// Emits terminal cancellation to the operation, on its executor.
void cancel_on_executor(const asio::any_io_executor& ex, std::shared_ptr<BlockOnState> st);
std::string describe_exception(std::exception_ptr e);
Error block_on_timeout(Duration timeout, bool unwound);

template <class T, class F>
awaitable<void> block_on_entry(std::shared_ptr<BlockOnSlot<T>> st, F make) {
  auto r = co_await make();
  std::lock_guard lock(st->mutex);
  st->value.emplace(std::move(r));
}

}  // namespace detail

// Called while block_on waits (on the waiting thread, every `poll`): true stops the wait.
struct Interrupt {
  std::function<bool()> requested;
  Duration poll = std::chrono::milliseconds(20);
};

namespace detail {
// Waits for st.done up to `timeout`, asking `interrupt` every poll; returns st.done, and sets
// `interrupted` if the wait ended because interrupt.requested() said so.
bool wait_done_or_interrupted(BlockOnState& st, Duration timeout, const Interrupt& interrupt,
                              bool& interrupted);
}  // namespace detail

// Runs `make()` (which returns awaitable<result<T>>) on `ex` and waits up to `timeout` for its
// result. On timeout the operation is cancelled (asio terminal cancellation) and block_on
// waits up to `unwind` for it to finish before returning errc::timeout; an operation that
// ignores cancellation longer than that is abandoned (so `make` should own what it uses
// rather than point into the caller's stack). An exception from the operation becomes
// errc::internal. Called on ex's own thread: errc::internal at once (it would deadlock).
// With `interrupt`, the wait also ends when interrupt.requested() returns true (asked every
// interrupt.poll on the waiting thread): the operation is cancelled the same way and the
// result is errc::cancelled (a Python caller's Ctrl-C, for example).
template <class F>
auto block_on(asio::any_io_executor ex, F make, Duration timeout, Duration unwind = 2s,
              const Interrupt& interrupt = {})
    -> result<typename detail::awaitable_result<std::invoke_result_t<F&>>::type> {
  using T = typename detail::awaitable_result<std::invoke_result_t<F&>>::type;
  if (!ex) return make_error(errc::invalid_argument, "block_on: no executor");
  if (detail::running_in_executor_thread(ex))
    return make_error(errc::internal,
                      "block_on called on the executor's own thread (it would deadlock)");
  auto st = std::make_shared<detail::BlockOnSlot<T>>();
  asio::co_spawn(
      ex, detail::block_on_entry<T, F>(st, std::move(make)),
      asio::bind_cancellation_slot(st->signal.slot(), [st](std::exception_ptr e) {
        std::lock_guard lock(st->mutex);
        if (e && !st->value)
          st->value.emplace(make_error(
              errc::internal, "block_on: operation threw: " + detail::describe_exception(e)));
        st->done = true;
        st->cv.notify_all();
      }));
  bool interrupted = false;
  if (!detail::wait_done_or_interrupted(*st, timeout, interrupt, interrupted)) {
    detail::cancel_on_executor(ex, st);
    bool unwound = detail::wait_done_for(*st, unwind);
    if (interrupted) return make_error(errc::cancelled, "block_on: interrupted");
    std::lock_guard lock(st->mutex);
    if (unwound && st->value && st->value->has_value()) return std::move(*st->value);
    return detail::block_on_timeout(timeout, unwound);
  }
  std::lock_guard lock(st->mutex);
  return std::move(*st->value);
}

// An io_context with one thread running it (and a work guard keeping it alive while idle).
class IoThread {
 public:
  explicit IoThread(std::string name = "starling-io");
  ~IoThread();  // stop()
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

  asio::io_context& context() noexcept { return io_; }
  asio::any_io_executor executor() { return io_.get_executor(); }
  bool running_in_this_thread() { return io_.get_executor().running_in_this_thread(); }

  // Releases the work guard, lets queued work finish for up to `drain`, then stops the
  // context and joins the thread. errc::timeout if work was still pending after `drain`
  // (it was abandoned). Called on the io thread itself it only stops the context and returns
  // errc::internal (a thread cannot join itself). Idempotent.
  result<void> stop(Duration drain = 2s);
  bool stopped() const;

 private:
  void run();

  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool exited_ = false;  // guarded by mutex_
  std::thread thread_;
};

}  // namespace starling
