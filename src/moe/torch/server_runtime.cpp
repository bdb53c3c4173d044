// ExpertServer's runtime thread: batches, optimizer steps due by time, checkpoints and
// replica-state snapshots (expert_server.hpp).
#include "moe/torch/server_impl.hpp"
#include "starling/core/log.hpp"

namespace starling::moe {

void ExpertServer::Impl::save_checkpoints() {
  if (cfg.checkpoint_dir.empty()) return;
  for (auto& b : backends) {
    if (b->steps == b->saved_steps) continue;
    auto r = save_expert_checkpoint(cfg.checkpoint_dir, *b);
    if (r) {
      ++stats->checkpoints_saved;
    } else {
      ++stats->checkpoint_failures;
      logger("moe")->warn("{}", r.error().message());
    }
  }
}

void ExpertServer::Impl::take_snapshots() {
  for (auto& b : backends) {
    if (!b->state || b->steps == b->snapshot_steps) continue;
    auto s = expert_state(*b);
    if (!s) {
      ++stats->state_failures;
      logger("moe")->warn("{}", s.error().message());
      continue;
    }
    b->snapshot_steps = b->steps;
    auto shared = std::make_shared<const Bytes>(std::move(s).value());
    std::lock_guard lk(mu);
    b->snapshot = std::move(shared);
    b->snapshot_epoch = b->snapshot_steps;
    b->snapshot_new = true;
  }
}

std::optional<TimePoint> ExpertServer::Impl::step_overdue() {
  std::optional<TimePoint> next;
  const auto now = Clock::now();
  for (auto& b : backends) {
    if (b->accumulated_rows == 0) continue;
    const auto due = b->accumulating_since + cfg.max_step_delay;
    if (due <= now)
      step_expert(*stats, *b);
    else if (!next || due < *next)
      next = due;
  }
  return next;
}

void ExpertServer::Impl::apply_accumulated(TimePoint until) {
  for (auto& b : backends) {
    if (b->accumulated_rows == 0) continue;
    if (Clock::now() >= until) {
      logger("moe")->warn("expert {}: gradients of {} rows dropped at stop (stop_timeout)",
                          b->schema.uid, b->accumulated_rows);
      continue;
    }
    const auto rows = b->accumulated_rows;
    step_expert(*stats, *b);
    ++stats->final_steps;
    logger("moe")->info("expert {}: accumulated gradients of {} rows applied at stop (step {})",
                        b->schema.uid, rows, b->steps);
  }
}

void ExpertServer::Impl::runtime_loop() {
  run_batches();
  bool final = false;
  TimePoint until{};
  {
    std::lock_guard lk(mu);
    final = final_save;
    until = stop_deadline;
  }
  if (final) {  // stop()'s, here rather than on its io thread
    apply_accumulated(until);
    save_checkpoints();
  }
  runtime_exited = true;
}

void ExpertServer::Impl::run_batches() {
  std::unique_lock lk(mu);
  const bool checkpoints = !cfg.checkpoint_dir.empty();
  const bool snapshots = cfg.share_state && directory;
  const bool delayed_steps = cfg.step_samples > 0 && cfg.max_step_delay > Duration::zero();
  auto next_checkpoint = Clock::now() + cfg.checkpoint_period;
  auto next_snapshot = Clock::now() + cfg.declare_period;
  std::optional<TimePoint> next_step;
  while (!stopping) {
    if (!runtime_jobs.empty()) {
      auto jobs = std::move(runtime_jobs);
      runtime_jobs.clear();
      lk.unlock();
      for (auto& job : jobs) job();
      lk.lock();
      continue;
    }
    if (delayed_steps && next_step && Clock::now() >= *next_step) {
      lk.unlock();
      next_step = step_overdue();
      lk.lock();
      continue;
    }
    if (checkpoints && Clock::now() >= next_checkpoint) {
      lk.unlock();
      save_checkpoints();
      lk.lock();
      next_checkpoint = Clock::now() + cfg.checkpoint_period;
      continue;
    }
    if (snapshots && Clock::now() >= next_snapshot) {
      lk.unlock();
      take_snapshots();
      lk.lock();
      next_snapshot = Clock::now() + cfg.declare_period;
      continue;
    }
    auto batch = sched.next(Clock::now());
    if (!batch) {
      auto w = sched.next_wakeup();
      if (checkpoints && (!w || next_checkpoint < *w)) w = next_checkpoint;
      if (snapshots && (!w || next_snapshot < *w)) w = next_snapshot;
      if (next_step && (!w || *next_step < *w)) w = next_step;
      if (w)
        cv.wait_until(lk, *w);
      else
        cv.wait(lk);
      continue;
    }
    std::vector<Task> tasks;
    for (auto id : batch->tasks) {
      auto it = queued.find(id);
      if (it == queued.end()) continue;
      tasks.push_back(std::move(it->second));
      queued.erase(it);
    }
    auto [backend, backward] = pool_owner.at(batch->pool);
    lk.unlock();
    run_batch(cfg, *stats, *backend, backward, tasks);
    if (delayed_steps && backward && backend->accumulated_rows > 0) {
      const auto due = backend->accumulating_since + cfg.max_step_delay;
      if (!next_step || due < *next_step) next_step = due;
    }
    lk.lock();
  }
}

}  // namespace starling::moe
