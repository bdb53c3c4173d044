#include "starling/core/blocking.hpp"

#include <pthread.h>

#include <algorithm>

#include <asio/post.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>

#include "starling/core/log.hpp"

namespace starling {

namespace detail {

bool running_in_executor_thread(const asio::any_io_executor& ex) {
  using io_exec = asio::io_context::executor_type;
  using io_exec_tracked =
      decltype(asio::require(std::declval<io_exec>(), asio::execution::outstanding_work.tracked));
  using pool_exec = asio::thread_pool::executor_type;
  if (!ex) return false;
  // Deadlock is about the thread, so ask about the whole execution context (a strand's own
  // running_in_this_thread() would miss other work of the same io thread).
  if (auto* e = ex.target<io_exec>()) return e->running_in_this_thread();
  if (auto* e = ex.target<io_exec_tracked>()) return e->running_in_this_thread();
  if (auto* e = ex.target<pool_exec>()) return e->running_in_this_thread();
  if (auto* s = ex.target<asio::strand<io_exec>>())
    return s->get_inner_executor().running_in_this_thread();
  if (auto* s = ex.target<asio::strand<asio::any_io_executor>>())
    return running_in_executor_thread(s->get_inner_executor());
  return false;  // unknown executor type: cannot tell
}

bool wait_done_for(BlockOnState& st, Duration d) {
  constexpr Duration kLongest = std::chrono::hours(24 * 365 * 10);
  auto deadline = Clock::now() + std::clamp(d, Duration::zero(), kLongest);
  std::unique_lock lock(st.mutex);
  return st.cv.wait_until(lock, deadline, [&] { return st.done; });
}

bool wait_done_or_interrupted(BlockOnState& st, Duration timeout, const Interrupt& interrupt,
                              bool& interrupted) {
  if (!interrupt.requested) return wait_done_for(st, timeout);
  constexpr Duration kLongest = std::chrono::hours(24 * 365 * 10);
  const auto deadline = Clock::now() + std::clamp(timeout, Duration::zero(), kLongest);
  const Duration poll = std::max<Duration>(interrupt.poll, std::chrono::milliseconds(1));
  for (;;) {
    const auto now = Clock::now();
    if (now >= deadline) return wait_done_for(st, Duration::zero());
    if (wait_done_for(st, std::min<Duration>(poll, deadline - now))) return true;
    if (interrupt.requested()) {
      interrupted = true;
      return false;
    }
  }
}

void cancel_on_executor(const asio::any_io_executor& ex, std::shared_ptr<BlockOnState> st) {
  asio::post(ex, [st = std::move(st)] {
    {
      std::lock_guard lock(st->mutex);
      if (st->done) return;
    }
    st->signal.emit(asio::cancellation_type::terminal);
  });
}

std::string describe_exception(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "non-standard exception";
  }
}

Error block_on_timeout(Duration timeout, bool unwound) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
  if (!unwound)
    logger("core")->error(
        "block_on: operation timed out after {} ms and ignored cancellation; abandoned", ms);
  return make_error(errc::timeout, "block_on: operation did not finish within " +
                                       std::to_string(ms) + " ms" +
                                       (unwound ? "" : " (and did not unwind after cancellation)"));
}

}  // namespace detail

IoThread::IoThread(std::string name) : work_(asio::make_work_guard(io_)) {
  thread_ = std::thread([this] { run(); });
  std::string short_name = name.substr(0, 15);  // Linux limit
  pthread_setname_np(thread_.native_handle(), short_name.c_str());
}

IoThread::~IoThread() {
  (void)stop();
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id())
      thread_.detach();
    else
      thread_.join();
  }
}

void IoThread::run() {
  for (;;) {
    try {
      io_.run();
      break;
    } catch (const std::exception& e) {
      logger("core")->error("io thread: a handler threw: {}", e.what());
    } catch (...) {
      logger("core")->error("io thread: a handler threw a non-standard exception");
    }
  }
  std::lock_guard lock(mutex_);
  exited_ = true;
  cv_.notify_all();
}

result<void> IoThread::stop(Duration drain) {
  if (running_in_this_thread()) {
    io_.stop();
    return make_error(errc::internal, "IoThread::stop called on the io thread: stop requested");
  }
  if (!thread_.joinable()) return success();
  work_.reset();
  bool drained;
  {
    std::unique_lock lock(mutex_);
    drained = cv_.wait_for(lock, drain, [&] { return exited_; });
  }
  if (!drained) io_.stop();
  thread_.join();
  if (!drained)
    return make_error(
        errc::timeout,
        "IoThread::stop: work still pending after " +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(drain).count()) +
            " ms; abandoned");
  return success();
}

bool IoThread::stopped() const {
  std::lock_guard lock(mutex_);
  return exited_;
}

}  // namespace starling
