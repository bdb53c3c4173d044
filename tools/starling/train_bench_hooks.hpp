// Benchmark hooks of `starling train` (bench/time_to_accuracy.sh).
//
// --eval-pause-file FILE: while this trainer evaluates,
// the processes FILE lists (one id per line or space-separated) are stopped (SIGSTOP) and
// continued after (SIGCONT), so that the time the trainer subtracts as evaluation is time in
// which the collaboration computed nothing (bench/time_to_accuracy.sh). Otherwise the other
// trainers would compute on every core meanwhile and that computing would escape the count.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "starling/core/clock.hpp"
#include "starling/core/result.hpp"

namespace starling::cli {

// CPU seconds used by this process so far (all threads).
double process_cpu_seconds();

class EvalPause {
 public:
  // Reads FILE (a missing or unreadable file pauses nothing) and stops the processes it lists.
  explicit EvalPause(const std::string& file);
  ~EvalPause();  // continues them
  EvalPause(const EvalPause&) = delete;
  EvalPause& operator=(const EvalPause&) = delete;
  std::size_t paused() const { return pids_.size(); }

 private:
  std::vector<pid_t> pids_;
};

// Time to accuracy (--target-accuracy): wall and CPU seconds (all threads: training, torch's,
// the network's; robust to a machine shared with others) from the training clock's start,
// the time spent evaluating, and the first evaluation at or above the target.
class TimeToTarget {
 public:
  TimeToTarget();  // the clocks start now
  double elapsed() const;
  // Runs `evaluate()` with the processes `pause_file` lists stopped, counting its time.
  template <class F>
  auto evaluation(const std::string& pause_file, F&& evaluate) {
    const auto e0 = Clock::now();
    const double c0 = process_cpu_seconds();
    auto ev = [&] {
      EvalPause pause(pause_file);
      return evaluate();
    }();
    eval_time_ += Clock::now() - e0;
    eval_cpu_ += process_cpu_seconds() - c0;
    return ev;
  }
  // The first call records the target reached now at `epoch` and returns true.
  bool reach(std::uint64_t epoch);
  double eval_seconds() const;
  void end_training();  // CPU seconds stop counting (cpu_seconds in the report)
  // started_unix, cpu_seconds; with a target, eval_seconds and target_reached_*.
  void report(nlohmann::json& j, bool with_target) const;

 private:
  TimePoint t0_ = Clock::now();
  double started_unix_;
  double cpu0_ = process_cpu_seconds();
  double cpu_end_ = 0;
  Duration eval_time_{};
  double eval_cpu_ = 0;
  std::optional<double> reached_seconds_, reached_eval_seconds_, reached_cpu_;
  std::uint64_t reached_epoch_ = 0;
};

// --start-barrier DIR: a trainer ready to train (data loaded, network joined) creates
// DIR/ready.<pid>, then waits until DIR/go exists (at most `bound`), so that the trainers of a
// benchmark start their clocks together however unevenly their processes started.
result<void> wait_start_barrier(const std::string& dir, double bound_seconds);

}  // namespace starling::cli
