#include "starling/core/thread_pool.hpp"

#include <algorithm>

namespace starling {

ThreadPool::ThreadPool(std::size_t threads) {
  threads = std::max<std::size_t>(threads, 1);
  count_ = threads;
  threads_.reserve(threads);
  for (std::size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  shutdown();
}

std::size_t ThreadPool::default_threads() {
  return std::max<std::size_t>(std::thread::hardware_concurrency(), 1);
}

bool ThreadPool::stopped() const {
  std::lock_guard lock(mu_);
  return stop_;
}

bool ThreadPool::post(Task t) {
  {
    std::lock_guard lock(mu_);
    if (!stop_) {
      queue_.push_back(std::move(t));
      cv_.notify_one();
      return true;
    }
  }
  if (t.abandon) t.abandon();
  return false;
}

void ThreadPool::worker_loop() {
  for (;;) {
    Task t;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;  // shutdown() abandons whatever is still queued
      t = std::move(queue_.front());
      queue_.pop_front();
    }
    t.run();
  }
}

void ThreadPool::shutdown() {
  std::deque<Task> abandoned;
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    abandoned.swap(queue_);
    threads.swap(threads_);  // a concurrent second call finds nothing left to join
  }
  cv_.notify_all();
  for (auto& t : abandoned)
    if (t.abandon) t.abandon();
  for (auto& th : threads)
    if (th.joinable()) th.join();
}

namespace {
// Shared by the caller and the helper tasks of one parallel_for.
struct ForState {
  std::size_t begin, end, grain, pieces;
  std::atomic<std::size_t> next{0};  // next piece to hand out
  std::atomic<std::size_t> done{0};  // pieces finished or skipped
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;
  const std::function<void(std::size_t, std::size_t)>* fn;

  // Takes and runs pieces until none is left. Returns after the last piece it ran.
  void work() {
    for (;;) {
      std::size_t p = next.fetch_add(1, std::memory_order_relaxed);
      if (p >= pieces) return;
      if (!failed.load(std::memory_order_relaxed)) {
        std::size_t lo = begin + p * grain;
        std::size_t hi = std::min(end, lo + grain);
        try {
          (*fn)(lo, hi);
        } catch (...) {
          std::lock_guard lock(mu);
          if (!error) error = std::current_exception();
          failed.store(true, std::memory_order_relaxed);
        }
      }
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == pieces) {
        std::lock_guard lock(mu);
        cv.notify_all();
      }
    }
  }
};
}  // namespace

void ThreadPool::parallel_for(std::size_t begin, std::size_t end, std::size_t grain,
                              const std::function<void(std::size_t, std::size_t)>& fn) {
  if (end <= begin) return;
  grain = std::max<std::size_t>(grain, 1);
  std::size_t pieces = (end - begin - 1) / grain + 1;
  if (pieces == 1) {
    fn(begin, end);
    return;
  }
  auto st = std::make_shared<ForState>();
  st->begin = begin;
  st->end = end;
  st->grain = grain;
  st->pieces = pieces;
  st->fn = &fn;  // valid until every piece is done, which we wait for below
  std::size_t helpers = std::min(pieces - 1, size());
  for (std::size_t i = 0; i < helpers; ++i) {
    // A helper that starts after all pieces are taken does nothing and never touches fn.
    if (!post(Task{[st] { st->work(); }, {}})) break;
  }
  st->work();
  std::unique_lock lock(st->mu);
  st->cv.wait(lock, [&] { return st->done.load(std::memory_order_acquire) == pieces; });
  if (st->error) std::rethrow_exception(st->error);
}

}  // namespace starling
