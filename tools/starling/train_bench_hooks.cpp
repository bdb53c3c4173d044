#include "train_bench_hooks.hpp"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

namespace starling::cli {

EvalPause::EvalPause(const std::string& file) {
  if (file.empty()) return;
  std::ifstream in(file);
  long id = 0;
  while (in >> id) {
    // Never this process, its group or everything (0, -1): only positive ids of others.
    if (id <= 1 || id == static_cast<long>(getpid())) continue;
    if (kill(static_cast<pid_t>(id), SIGSTOP) == 0) pids_.push_back(static_cast<pid_t>(id));
  }
}

EvalPause::~EvalPause() {
  for (const pid_t p : pids_) kill(p, SIGCONT);
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

TimeToTarget::TimeToTarget()
    : started_unix_(
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count()) {}

double TimeToTarget::elapsed() const {
  return std::chrono::duration<double>(Clock::now() - t0_).count();
}

double TimeToTarget::eval_seconds() const {
  return std::chrono::duration<double>(eval_time_).count();
}

bool TimeToTarget::reach(std::uint64_t epoch) {
  if (reached_seconds_) return false;
  reached_seconds_ = elapsed();
  reached_eval_seconds_ = eval_seconds();
  reached_epoch_ = epoch;
  reached_cpu_ = process_cpu_seconds() - cpu0_ - eval_cpu_;
  return true;
}

void TimeToTarget::end_training() {
  cpu_end_ = process_cpu_seconds() - cpu0_ - eval_cpu_;
}

void TimeToTarget::report(nlohmann::json& j, bool with_target) const {
  // The wall-clock instant the clock started: a harness compares the trainers' starts.
  j["started_unix"] = started_unix_;
  j["cpu_seconds"] = cpu_end_;
  if (!with_target) return;
  j["eval_seconds"] = eval_seconds();
  if (!reached_seconds_) return;
  j["target_reached_seconds"] = *reached_seconds_;
  j["target_reached_eval_seconds"] = *reached_eval_seconds_;
  j["target_reached_epoch"] = reached_epoch_;
  j["target_reached_cpu_seconds"] = *reached_cpu_;
}

result<void> wait_start_barrier(const std::string& dir, double bound_seconds) {
  namespace fs = std::filesystem;
  const fs::path d(dir);
  std::error_code ec;
  {
    std::ofstream ready(d / ("ready." + std::to_string(getpid())));
    if (!ready) return make_error(errc::io, "--start-barrier: cannot write in " + dir);
  }
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(bound_seconds);
  while (!fs::exists(d / "go", ec)) {
    if (std::chrono::steady_clock::now() > until)
      return make_error(errc::timeout, "--start-barrier: no " + (d / "go").string() + " in time");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return success();
}

}  // namespace starling::cli
