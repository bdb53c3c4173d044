// Shared bits of the DHT benchmark: parameters, latency summaries, process memory, JSON output.
#pragma once

#include <sys/resource.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace bench {

struct Params {
  std::size_t nodes = 64;
  std::size_t ops = 100;  // keys stored, and gets before and after churn
  double churn = 0.3;     // fraction of nodes stopped before the second round of gets
  std::uint64_t seed = 1;
  std::size_t per_proc = 64;  // nodes per worker process (0 = all in one)
  double join_wait_s = 60;    // OpenDHT: longest wait for the nodes to know good peers
};

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Open file descriptors of this process.
inline long open_fds() {
  long n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

// Resident set size of this process in KiB (Linux /proc).
inline long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  return 0;
}

// One operation as a worker measured it.
struct Outcome {
  bool ok = false;
  double ms = 0;
  long hops = -1;  // lookup hops to the node that had the value (-1: unknown)
};

// A quantile of sorted samples and its distribution-free 95% confidence interval: the order
// statistics whose ranks bound n*p within 1.96 binomial standard deviations (no resampling).
struct Quantile {
  double value = 0, lo = 0, hi = 0;
};
inline Quantile quantile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return {};
  const double n = static_cast<double>(sorted.size());
  const double sd = 1.96 * std::sqrt(n * p * (1 - p));
  auto at = [&](double r) {
    const double c = std::clamp(r, 0.0, n - 1);
    return sorted[static_cast<std::size_t>(c)];
  };
  return {at(std::floor(p * n)), at(std::floor(p * n - sd)), at(std::ceil(p * n + sd))};
}

// CPU time (user + system) this process used so far, all threads.
inline double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

// Latencies of successful operations and the success count of one kind of operation, with the
// connections the operating node opened during each (Starling) and its lookup hops.
struct Series {
  struct Op {
    bool ok;
    double ms;
    std::uint64_t dials;
    long hops;
  };
  std::vector<Op> ops;
  double cpu_s = 0;             // CPU time all worker processes used during these operations
  std::uint64_t all_dials = 0;  // connections every node opened meanwhile (background too)
  void add(bool success, double latency_ms, std::uint64_t opened = 0, long hops = -1) {
    ops.push_back(Op{success, latency_ms, opened, hops});
  }
  static nlohmann::json summary(std::vector<double> s) {
    std::sort(s.begin(), s.end());
    double mean = 0;
    for (double v : s) mean += v;
    if (!s.empty()) mean /= static_cast<double>(s.size());
    const Quantile q50 = quantile(s, 0.5), q90 = quantile(s, 0.9), q99 = quantile(s, 0.99);
    return {{"n", s.size()},       {"p50_ms", q50.value}, {"p50_lo_ms", q50.lo},
            {"p50_hi_ms", q50.hi}, {"p90_ms", q90.value}, {"p90_lo_ms", q90.lo},
            {"p90_hi_ms", q90.hi}, {"p99_ms", q99.value}, {"p99_lo_ms", q99.lo},
            {"p99_hi_ms", q99.hi}, {"mean_ms", mean}};
  }
  nlohmann::json json() const {
    std::vector<double> all, dialed, undialed;
    std::size_t ok = 0;
    std::uint64_t dials = 0;
    for (const auto& o : ops) {
      dials += o.dials;
      if (!o.ok) continue;
      ++ok;
      all.push_back(o.ms);
      (o.dials ? dialed : undialed).push_back(o.ms);
    }
    const double total = static_cast<double>(ops.size());
    auto j = summary(all);
    j["ok"] = ok;
    j["total"] = ops.size();
    j["dials_per_op"] = total > 0 ? static_cast<double>(dials) / total : 0.0;
    j["success"] = total > 0 ? static_cast<double>(ok) / total : 0.0;
    j["cpu_ms_per_op"] = total > 0 ? cpu_s * 1000 / total : 0.0;
    j["all_dials_per_op"] = total > 0 ? static_cast<double>(all_dials) / total : 0.0;
    // The operations that opened a connection on their way and those that did not.
    j["with_dials"] = summary(dialed);
    j["without_dials"] = summary(undialed);
    return j;
  }
};

struct Report {
  std::string system;
  Params p;
  double setup_s = 0;
  double idle_cores = 0;  // CPU the idle nodes of all workers use after the join, in cores
  std::size_t procs = 1;
  long max_fds = 0;                            // the most file descriptors one worker process held
  long rss_before_kib = 0, rss_after_kib = 0;  // summed over the worker processes
  Series store, store_again, get, get_after_churn;
  nlohmann::json json() const {
    return {{"system", system},
            {"nodes", p.nodes},
            {"ops", p.ops},
            {"procs", procs},
            {"max_fds_per_proc", max_fds},
            {"churn", p.churn},
            {"setup_s", setup_s},
            {"idle_cores", idle_cores},
            {"kib_per_node", static_cast<double>(rss_after_kib - rss_before_kib) /
                                 static_cast<double>(std::max<std::size_t>(p.nodes, 1))},
            {"store", store.json()},
            {"store_again", store_again.json()},
            {"get", get.json()},
            {"get_after_churn", get_after_churn.json()}};
  }
};

inline Params parse_params(int argc, char** argv, int first) {
  Params p;
  for (int i = first; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--nodes")
      p.nodes = std::strtoul(argv[i + 1], nullptr, 10);
    else if (a == "--ops")
      p.ops = std::strtoul(argv[i + 1], nullptr, 10);
    else if (a == "--churn")
      p.churn = std::strtod(argv[i + 1], nullptr);
    else if (a == "--seed")
      p.seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--per-proc")
      p.per_proc = std::strtoul(argv[i + 1], nullptr, 10);
    else if (a == "--join-wait")
      p.join_wait_s = std::strtod(argv[i + 1], nullptr);
  }
  if (p.nodes < 4) p.nodes = 4;
  if (p.per_proc == 0 || p.per_proc > p.nodes) p.per_proc = p.nodes;
  return p;
}

// Which nodes to stop (a random `churn` fraction, never node 0, the bootstrap node).
inline std::vector<std::size_t> churn_victims(const Params& p, std::mt19937_64& rng) {
  std::vector<std::size_t> idx;
  for (std::size_t i = 1; i < p.nodes; ++i) idx.push_back(i);
  std::shuffle(idx.begin(), idx.end(), rng);
  idx.resize(static_cast<std::size_t>(p.churn * static_cast<double>(p.nodes)));
  return idx;
}

}  // namespace bench
