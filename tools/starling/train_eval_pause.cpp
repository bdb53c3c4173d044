#include "train_eval_pause.hpp"

#include <signal.h>
#include <unistd.h>

#include <fstream>

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

}  // namespace starling::cli
