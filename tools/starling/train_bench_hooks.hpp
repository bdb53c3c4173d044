// Benchmark hooks of `starling train` (bench/time_to_accuracy.sh).
//
// --eval-pause-file FILE: while this trainer evaluates,
// the processes FILE lists (one id per line or space-separated) are stopped (SIGSTOP) and
// continued after (SIGCONT), so that the time the trainer subtracts as evaluation is time in
// which the collaboration computed nothing (bench/time_to_accuracy.sh). Otherwise the other
// trainers would compute on every core meanwhile and that computing would escape the count.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "starling/core/result.hpp"

namespace starling::cli {

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

// CPU seconds used by this process so far (all threads).
double process_cpu_seconds();

// --start-barrier DIR: a trainer ready to train (data loaded, network joined) creates
// DIR/ready.<pid>, then waits until DIR/go exists (at most `bound`), so that the trainers of a
// benchmark start their clocks together however unevenly their processes started.
result<void> wait_start_barrier(const std::string& dir, double bound_seconds);

}  // namespace starling::cli
