// ThreadPool: a small fixed set of worker threads for compute-heavy work (compression,
// reduction) so it never runs on a node's I/O thread.
//
// Threading rule: every member function is thread-safe. Tasks run on the pool's threads;
// run() completes on the executor of the coroutine that awaited it. parallel_for() may be
// called from any thread, including a pool worker (the caller always takes part, so nested
// use cannot deadlock).
//
// Shutdown: shutdown() (and the destructor) stops accepting work, abandons queued tasks
// (their futures report std::future_errc::broken_promise; run() reports errc::cancelled) and
// joins the workers after the tasks already running return. It is therefore bounded by the
// longest running task: submit work in pieces, not one unbounded job.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <asio/post.hpp>
#include "starling/core/timer.hpp"

#include "starling/core/async.hpp"

namespace starling {

namespace detail {
template <class T>
struct is_result : std::false_type {};
template <class T>
struct is_result<result<T>> : std::true_type {};
// run(f) yields result<R> for an f returning R, and result<X> (not nested) for result<X>.
template <class R>
struct run_result {
  using type = result<R>;
};
template <class T>
struct run_result<result<T>> {
  using type = result<T>;
};
}  // namespace detail

class ThreadPool {
 public:
  // A pool with `threads` workers (at least 1).
  explicit ThreadPool(std::size_t threads = default_threads());
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // std::thread::hardware_concurrency(), at least 1.
  static std::size_t default_threads();

  // Number of worker threads the pool was created with.
  std::size_t size() const noexcept { return count_; }
  bool stopped() const;

  // Queues `f` and returns its future. After shutdown() the future is broken
  // (std::future_errc::broken_promise) and `f` never runs.
  template <class F>
  auto submit(F&& f) -> std::future<std::invoke_result_t<std::decay_t<F>&>>;

  // Calls fn(lo, hi) over [begin, end) split into pieces of `grain` indices (the last may be
  // shorter); every index is covered exactly once. The caller works too and returns when
  // every piece is done. If fn throws, pieces not yet started are skipped and the first
  // exception is rethrown here. After shutdown() everything runs on the caller.
  void parallel_for(std::size_t begin, std::size_t end, std::size_t grain,
                    const std::function<void(std::size_t, std::size_t)>& fn);

  // Runs `f` on the pool and resumes the awaiting coroutine on its own executor with the
  // value (an exception from f is rethrown there). f is destroyed on the pool thread before
  // the coroutine resumes (or, if it never ran, wherever the pool drops the task). Cancelling the
  // awaiting coroutine before f has started removes it (errc::cancelled); once f runs, the await
  // lasts until f returns, because f may use data owned by the awaiting coroutine.
  template <class F>
  auto run(F f) -> awaitable<typename detail::run_result<std::invoke_result_t<F&>>::type>;

  // Stops accepting work, abandons queued tasks, joins the workers. Idempotent. Must not be
  // called from a worker of this pool.
  void shutdown();

 private:
  struct Task {
    std::function<void()> run;      // executes the work
    std::function<void()> abandon;  // called instead of run when the pool shuts down
  };
  template <class Out>
  struct RunState;
  template <class F, class Out>
  static Task make_run_task(std::shared_ptr<RunState<Out>> st, F f);
  // Queues `t`; if the pool is stopped, calls t.abandon() at once and returns false.
  bool post(Task t);
  void worker_loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
  std::size_t count_ = 0;
};

// ---- templates ----

template <class F>
auto ThreadPool::submit(F&& f) -> std::future<std::invoke_result_t<std::decay_t<F>&>> {
  using R = std::invoke_result_t<std::decay_t<F>&>;
  auto task = std::make_shared<std::packaged_task<R()>>(std::forward<F>(f));
  auto fut = task->get_future();
  // Abandoning destroys the last reference to the packaged_task without running it, which
  // stores broken_promise in the future.
  auto holder = std::make_shared<std::shared_ptr<std::packaged_task<R()>>>(task);
  task.reset();
  post(Task{[holder] {
              auto t = std::move(*holder);
              if (t) (*t)();
            },
            [holder] { holder->reset(); }});
  return fut;
}

// State shared between run()'s coroutine and the worker executing its task. It holds no
// I/O object, so whichever thread drops the last reference may destroy it. The timer the
// coroutine sleeps on lives in the coroutine frame and is reached only through the
// completion handler, which runs on the coroutine's executor.
template <class Out>
struct ThreadPool::RunState {
  enum Phase : int { kQueued = 0, kRunning = 1, kCancelled = 2 };
  explicit RunState(asio::any_io_executor e) : ex(std::move(e)) {}
  asio::any_io_executor ex;
  std::atomic<int> phase{kQueued};
  std::optional<Out> value;  // written by the worker before it posts completion
  std::exception_ptr error;
  // On `ex` only:
  Timer* timer = nullptr;  // set while the coroutine waits
  bool done = false;

  // From any thread, once: wakes the coroutine on its executor.
  static void finish(std::shared_ptr<RunState> st) {
    auto ex = st->ex;
    asio::post(ex, [st = std::move(st)] {
      st->done = true;
      if (st->timer) st->timer->cancel();
    });
  }
  // Clears `timer` when the coroutine's frame goes away.
  struct TimerGuard {
    RunState* s;
    ~TimerGuard() { s->timer = nullptr; }
  };
};

// Built outside the coroutine body (GCC 12 crashes on lambdas nested in coroutine lambdas).
template <class F, class Out>
ThreadPool::Task ThreadPool::make_run_task(std::shared_ptr<RunState<Out>> st, F f) {
  using R = std::invoke_result_t<F&>;
  using State = RunState<Out>;
  auto holder = std::make_shared<std::optional<F>>(std::move(f));
  Task t;
  t.run = [st, holder] {
    int expected = State::kQueued;
    if (!st->phase.compare_exchange_strong(expected, State::kRunning)) return;
    {
      // f is called and destroyed before the coroutine is woken.
      F fn = std::move(**holder);
      holder->reset();
      try {
        if constexpr (std::is_void_v<R>) {
          fn();
          st->value.emplace(success());
        } else {
          st->value.emplace(fn());
        }
      } catch (...) {
        st->error = std::current_exception();
      }
    }
    State::finish(st);
  };
  t.abandon = [st] {
    int expected = State::kQueued;
    if (st->phase.compare_exchange_strong(expected, State::kCancelled)) State::finish(st);
  };
  return t;
}

template <class F>
auto ThreadPool::run(F f)
    -> awaitable<typename detail::run_result<std::invoke_result_t<F&>>::type> {
  using Out = typename detail::run_result<std::invoke_result_t<F&>>::type;
  using State = RunState<Out>;
  auto ex = co_await asio::this_coro::executor;
  auto st = std::make_shared<State>(ex);
  Timer timer(ex, TimePoint::max());
  st->timer = &timer;
  typename State::TimerGuard guard{st.get()};
  post(make_run_task<F, Out>(st, std::move(f)));
  for (;;) {
    if (st->done) break;
    (void)co_await timer.async_wait(use_nothrow);
    if (st->done) break;
    auto cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none) {
      int expected = State::kQueued;
      if (st->phase.compare_exchange_strong(expected, State::kCancelled))
        co_return make_error(errc::cancelled, "thread pool task cancelled before it started");
      // Already running: keep waiting, it may use our caller's data.
      co_await asio::this_coro::reset_cancellation_state();
    }
  }
  if (st->error) std::rethrow_exception(st->error);
  if (!st->value) co_return make_error(errc::cancelled, "thread pool shut down");
  co_return std::move(*st->value);
}

}  // namespace starling
