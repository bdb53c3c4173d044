// The caller's check of a downloaded state (LoadStateOptions::verify), run on the worker pool
// so that hashing or decoding a large state never blocks the host's I/O thread.
//
// Threading rule: verify_on_pool() runs on the host's executor; the check runs on a pool
// thread and posts its result back. The wait ends at the deadline or on cancellation even
// while the check runs: the job owns everything the check touches (the function, the manifest
// and the data), and the pool thread hands its reference back to the executor, so the job is
// always released there.
#include <asio/post.hpp>

#include "starling/core/log.hpp"
#include "starling/core/thread_pool.hpp"
#include "state_download.hpp"

namespace starling::averaging::detail {
namespace {

struct VerifyJob {
  VerifyJob(asio::any_io_executor e, VerifyFn f, StateManifest m, Bytes d)
      : ex(std::move(e)), fn(std::move(f)), manifest(std::move(m)), data(std::move(d)), done(ex) {}
  asio::any_io_executor ex;
  VerifyFn fn;
  StateManifest manifest;
  Bytes data;
  std::optional<result<void>> value;  // set on the executor
  AsyncEvent done;
};

// Hands the result (and the job's last pool-side reference) back to the executor.
void finish(std::shared_ptr<VerifyJob> job, result<void> r) {
  auto ex = job->ex;
  asio::post(ex, [job = std::move(job), r = std::move(r)]() mutable {
    job->value.emplace(std::move(r));
    job->done.set();
  });
}

// A pool task (a plain function object: GCC 12 mishandles lambdas nested in coroutines). If the
// pool drops it unrun (shutdown), the waiter learns at once.
struct VerifyTask {
  std::shared_ptr<VerifyJob> job;
  explicit VerifyTask(std::shared_ptr<VerifyJob> j) : job(std::move(j)) {}
  VerifyTask(VerifyTask&&) noexcept = default;
  VerifyTask& operator=(VerifyTask&&) = delete;
  ~VerifyTask() {
    if (job) finish(std::move(job), make_error(errc::cancelled, "thread pool shut down"));
  }
  void operator()() {
    result<void> r = success();
    try {
      r = job->fn(job->manifest, job->data);
    } catch (const std::exception& e) {
      r = make_error(errc::internal, std::string("the check threw: ") + e.what());
    } catch (...) {
      r = make_error(errc::internal, "the check threw");
    }
    finish(std::move(job), std::move(r));
  }
};

}  // namespace

awaitable<result<Verified>> verify_on_pool(ThreadPool& pool, VerifyFn fn, StateManifest m,
                                           Bytes data, TimePoint deadline) {
  auto ex = co_await asio::this_coro::executor;
  auto job = std::make_shared<VerifyJob>(ex, std::move(fn), std::move(m), std::move(data));
  (void)pool.submit(VerifyTask(job));
  const Duration left = std::max<Duration>(deadline - Clock::now(), Duration::zero());
  auto waited = co_await with_timeout(job->done.wait(), left, "state check");
  if (!waited) co_return waited.error();  // timeout or cancelled: the check may still run
  // The pool thread has returned from the check (it posted the value), so the data is ours.
  Verified out;
  out.check = std::move(*job->value);
  out.data = std::move(job->data);
  co_return out;
}

}  // namespace starling::averaging::detail
