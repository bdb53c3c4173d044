// CPU time of the whole process (all threads, user + system), in seconds: the load-independent
// cost of a round that bench_allreduce and gloo_allreduce print beside their wall times.
#pragma once

#include <sys/resource.h>
#include <time.h>

namespace starling::bench {

inline double process_cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

// Seconds on `clock` (CLOCK_THREAD_CPUTIME_ID, CLOCK_MONOTONIC, ...).
inline double clock_s(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace starling::bench
