// RoundRunner's end (round_runner.hpp): close() drains the writers, half-closes the streams,
// waits (bounded) for the peers' EOF and for the pool tasks, and returns the round's outcome.
#include "round_runner.hpp"

#include "starling/core/log.hpp"

namespace starling::averaging::detail {

awaitable<result<void>> RoundRunner::close() {
  auto self = shared_from_this();
  ending_ = true;
  const bool ok = core_.status() == RoundCore::Status::done;
  if (ok) {
    // Our last messages (Fin2 for a non-client) must reach everyone: drain, then half-close.
    const TimePoint until = Clock::now() + cfg_.linger;
    while (!drained() && Clock::now() < until) {
      progress_.reset();
      (void)co_await with_timeout(progress_.wait(), until - Clock::now(), "drain");
    }
    for (auto& p : p_) {
      if (p.fenced) continue;
      p.wake->set();
      for (auto& s : p.streams) (void)co_await with_timeout(s->close_write(), 1s, "close write");
    }
    // Resetting now could discard our last frames at a slower peer: wait for every peer to
    // finish and close its side too (bounded).
    const TimePoint eof_until = Clock::now() + cfg_.linger;
    while (readers_ > 0 && Clock::now() < eof_until) {
      progress_.reset();
      (void)co_await with_timeout(progress_.wait(), eof_until - Clock::now(), "peers' EOF");
    }
  }
  for (auto& p : p_) {
    for (auto& s : p.streams) s->reset();
    p.wake->set();
  }
  timer_.cancel();
  (void)co_await scope_.close(2s);
  co_await wait_pool_tasks();
  times_.closed = Clock::now();
  if (core_.status() == RoundCore::Status::running)
    co_return make_error(
        errc::timeout, "all-reduce: round did not finish by its deadline (" + core_.phase() + ")");
  if (!ok) co_return core_.error();
  co_return success();
}

awaitable<void> RoundRunner::wait_pool_tasks() {
  const TimePoint until = std::max(deadline_, Clock::now()) + cfg_.linger;
  while (pool_tasks_ > 0 && Clock::now() < until) {
    pool_idle_.reset();
    (void)co_await with_timeout(pool_idle_.wait(), until - Clock::now(), "pool tasks");
  }
  if (pool_tasks_ == 0) co_return;
  gate_->closed.store(true);
  logger("averaging")
      ->warn(
          "all-reduce: {} pool task(s) still queued or running after the round's deadline; "
          "they will not touch its buffers",
          pool_tasks_);
  // Tasks already inside finish a bounded computation (one part): wait for them.
  const TimePoint hard = Clock::now() + 10s;
  while (gate_->inside.load() > 0 && Clock::now() < hard) {
    pool_idle_.reset();
    (void)co_await with_timeout(pool_idle_.wait(), 5ms, "pool tasks inside");
  }
  if (gate_->inside.load() > 0)
    logger("averaging")->error("all-reduce: a pool task is still reducing after 10 s");
}

bool RoundRunner::drained() const {
  for (std::uint32_t j = 0; j < n_; ++j)
    if (!p_[j].fenced && p_[j].send && (!p_[j].queue.empty() || p_[j].writing)) return false;
  return true;
}

}  // namespace starling::averaging::detail
