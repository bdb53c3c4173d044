// BatchScheduler (see batching.hpp).
#include "starling/moe/batching.hpp"

#include <algorithm>

namespace starling::moe {

std::size_t BatchScheduler::add_pool(const PoolConfig& cfg) {
  Pool p;
  p.cfg = cfg;
  if (p.cfg.max_batch == 0) p.cfg.max_batch = 1;
  p.cfg.min_batch = std::clamp<std::size_t>(p.cfg.min_batch, 1, p.cfg.max_batch);
  pools_.push_back(std::move(p));
  return pools_.size() - 1;
}

std::optional<BatchScheduler::TaskId> BatchScheduler::push(std::size_t pool, std::size_t rows,
                                                           TimePoint now) {
  Pool& p = pools_.at(pool);
  if (rows == 0 || rows > p.cfg.max_batch) return std::nullopt;
  const TaskId id = next_id_++;
  p.tasks.push_back(Task{id, rows, now});
  p.rows += rows;
  return id;
}

bool BatchScheduler::remove(TaskId id) {
  for (auto& p : pools_) {
    auto it =
        std::find_if(p.tasks.begin(), p.tasks.end(), [id](const Task& t) { return t.id == id; });
    if (it != p.tasks.end()) {
      p.rows -= it->rows;
      p.tasks.erase(it);
      return true;
    }
  }
  return false;
}

std::optional<BatchScheduler::Batch> BatchScheduler::next(TimePoint now) {
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    if (!pools_[i].ready(now)) continue;
    if (!best || pools_[i].tasks.front().enqueued < pools_[*best].tasks.front().enqueued ||
        (pools_[i].tasks.front().enqueued == pools_[*best].tasks.front().enqueued &&
         pools_[i].tasks.front().id < pools_[*best].tasks.front().id))
      best = i;
  }
  if (!best) return std::nullopt;
  Pool& p = pools_[*best];
  Batch b;
  b.pool = *best;
  while (!p.tasks.empty()) {
    const Task& t = p.tasks.front();
    if (!b.tasks.empty() && b.rows + t.rows > p.cfg.max_batch) break;
    b.tasks.push_back(t.id);
    b.rows += t.rows;
    p.rows -= t.rows;
    p.tasks.pop_front();
  }
  return b;
}

std::optional<TimePoint> BatchScheduler::next_wakeup() const {
  std::optional<TimePoint> out;
  for (const auto& p : pools_) {
    if (p.tasks.empty()) continue;
    TimePoint t =
        p.rows >= p.cfg.min_batch ? TimePoint::min() : p.tasks.front().enqueued + p.cfg.max_wait;
    if (!out || t < *out) out = t;
  }
  return out;
}

std::size_t BatchScheduler::queued_tasks() const {
  std::size_t n = 0;
  for (const auto& p : pools_) n += p.tasks.size();
  return n;
}

}  // namespace starling::moe
