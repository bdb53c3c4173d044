#include "train_bench_hooks.hpp"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

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
