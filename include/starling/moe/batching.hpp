// BatchScheduler: the I/O-free core of an expert server's batching (hivemind's task pools).
// One pool per expert and direction (forward, backward); each request is a task of some rows.
// A pool is ready when its rows reach min_batch or its oldest task has waited max_wait; the
// scheduler hands out one batch at a time from the ready pool whose oldest task is oldest
// (oldest-first across experts), taking that pool's tasks in arrival order up to max_batch
// rows (at least one task). Time is a parameter; nothing here blocks or locks.
//
// Threading: a plain object; the expert server's runtime guards it with its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "starling/core/clock.hpp"

namespace starling::moe {

struct PoolConfig {
  std::size_t min_batch = 1;     // rows that make a pool ready at once
  std::size_t max_batch = 4096;  // rows in one batch at most (a larger task is refused)
  Duration max_wait = 2ms;       // the oldest task waits at most this long for more rows
};

class BatchScheduler {
 public:
  using TaskId = std::uint64_t;
  struct Batch {
    std::size_t pool = 0;
    std::vector<TaskId> tasks;  // in arrival order
    std::size_t rows = 0;
  };

  // Returns the new pool's index.
  std::size_t add_pool(const PoolConfig& cfg);
  const PoolConfig& config(std::size_t pool) const { return pools_.at(pool).cfg; }

  // Queues a task of `rows` rows (1..max_batch, else std::nullopt: the caller refuses it).
  std::optional<TaskId> push(std::size_t pool, std::size_t rows, TimePoint now);
  // Drops a queued task (its caller gave up). False if it is not queued (already taken).
  bool remove(TaskId id);
  // The next batch to run at `now`, or std::nullopt if no pool is ready.
  std::optional<Batch> next(TimePoint now);
  // When a pool becomes ready by waiting (the earliest oldest-task + max_wait), if any task
  // is queued; time_point::min() if some pool is ready now.
  std::optional<TimePoint> next_wakeup() const;

  std::size_t queued_tasks() const;
  std::size_t queued_rows(std::size_t pool) const { return pools_.at(pool).rows; }

 private:
  struct Task {
    TaskId id;
    std::size_t rows;
    TimePoint enqueued;
  };
  struct Pool {
    PoolConfig cfg;
    std::deque<Task> tasks;
    std::size_t rows = 0;
    bool ready(TimePoint now) const {
      return !tasks.empty() &&
             (rows >= cfg.min_batch || now >= tasks.front().enqueued + cfg.max_wait);
    }
  };
  std::vector<Pool> pools_;
  TaskId next_id_ = 1;
};

}  // namespace starling::moe
