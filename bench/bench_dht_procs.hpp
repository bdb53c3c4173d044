// The DHT benchmark across processes: one coordinator forks worker processes (before it starts
// any thread), each worker runs a slice of the N nodes and obeys one-line commands on a pipe.
// The coordinator drives the same operations as a single process would (one at a time), picks
// nodes and values, and gathers the latencies the workers measured. So N is bounded by the
// machine, not by one process's file-descriptor limit (Starling holds one TCP connection per
// peer pair). Commands (reply: one line starting with "ok" or "err"):
//   start <first global index> <count> <seed address>...  -> ok <address of each new node>
//   join                                                   -> ok        (wait until joined)
//   store|get <local index> <key index> <hex value>        -> ok <0|1> <ms> <connections opened>
//                                                             <hops, -1 = unknown>
//   kill <local index>                                     -> ok
//   stats                                                  -> ok <rss KiB> <open fds>
//   cpu                                                    -> ok <CPU seconds used> <dials by all>
//   quit                                                   -> ok        (every node stopped)
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_dht_stats.hpp"

namespace bench {

using Blob = std::vector<std::uint8_t>;

// One worker's nodes, of either system.
class NodeSet {
 public:
  virtual ~NodeSet() = default;
  // Starts one node that joins through `seeds` (empty for the first node); its address.
  virtual std::string start_node(std::uint64_t seed, const std::vector<std::string>& seeds) = 0;
  // Waits (bounded) until the started nodes are ready to serve.
  virtual void wait_joined(double /*max_s*/) {}
  // Store / get key `k` through node `i`: success, latency in ms, lookup hops if known.
  virtual Outcome store(std::size_t i, std::size_t k, const Blob& v) = 0;
  virtual Outcome get(std::size_t i, std::size_t k, const Blob& want) = 0;
  // Connections node `i` has opened so far (0 for a connectionless system).
  virtual std::uint64_t dials(std::size_t /*i*/) const { return 0; }
  virtual void stop_node(std::size_t i) = 0;
  virtual void stop_all() = 0;
};

inline std::string hex(const Blob& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (auto c : b) {
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

inline Blob unhex(const std::string& s) {
  Blob b;
  for (std::size_t i = 0; i + 1 < s.size(); i += 2)
    b.push_back(static_cast<std::uint8_t>(std::stoi(s.substr(i, 2), nullptr, 16)));
  return b;
}

// The worker side: obeys commands on `in`, answers on `out`, until quit or end of input.
inline int worker_main(NodeSet& set, const Params& p, FILE* in, FILE* out) {
  const long rss0 = rss_kib();
  std::vector<bool> alive;
  char* buf = nullptr;
  std::size_t cap = 0;
  while (getline(&buf, &cap, in) > 0) {
    std::istringstream line(buf);
    std::string cmd;
    line >> cmd;
    std::ostringstream reply;
    reply << "ok";
    if (cmd == "start") {
      std::size_t first = 0, count = 0;
      line >> first >> count;
      std::vector<std::string> given;
      for (std::string a; line >> a;) given.push_back(a);
      std::mt19937_64 rng(p.seed * 7919 + first);
      std::vector<std::string> mine;
      for (std::size_t j = 0; j < count; ++j) {
        auto seeds = given;
        if (!mine.empty())  // and a random node started before in this worker
          seeds.push_back(
              mine[std::uniform_int_distribution<std::size_t>(0, mine.size() - 1)(rng)]);
        mine.push_back(set.start_node(p.seed * 1000 + first + j + 1, seeds));
        alive.push_back(true);
        reply << ' ' << mine.back();
      }
    } else if (cmd == "join") {
      set.wait_joined(p.join_wait_s);
    } else if (cmd == "store" || cmd == "get") {
      std::size_t i = 0, k = 0;
      std::string v;
      line >> i >> k >> v;
      const auto dials0 = set.dials(i);
      const Outcome o = cmd == "store" ? set.store(i, k, unhex(v)) : set.get(i, k, unhex(v));
      reply << ' ' << (o.ok ? 1 : 0) << ' ' << o.ms << ' ' << set.dials(i) - dials0 << ' '
            << o.hops;
    } else if (cmd == "kill") {
      std::size_t i = 0;
      line >> i;
      if (i < alive.size() && alive[i]) set.stop_node(i);
      if (i < alive.size()) alive[i] = false;
    } else if (cmd == "stats") {
      reply << ' ' << rss_kib() - rss0 << ' ' << open_fds();
    } else if (cmd == "cpu") {
      std::uint64_t dials = 0;  // connections opened by every live node so far
      for (std::size_t i = 0; i < alive.size(); ++i)
        if (alive[i]) dials += set.dials(i);
      reply << ' ' << cpu_seconds() << ' ' << dials;
    } else if (cmd == "quit") {
      set.stop_all();
      std::fprintf(out, "ok\n");
      std::fflush(out);
      break;
    } else {
      reply.str("err unknown command " + cmd);
    }
    std::fprintf(out, "%s\n", reply.str().c_str());
    std::fflush(out);
  }
  std::free(buf);
  return 0;
}

// A forked worker as the coordinator sees it.
struct Worker {
  pid_t pid = -1;
  FILE* to = nullptr;
  FILE* from = nullptr;
  std::size_t first = 0, count = 0;  // global indices [first, first + count)

  void send(const std::string& line) {
    std::fprintf(to, "%s\n", line.c_str());
    std::fflush(to);
  }
  std::istringstream receive() {
    char* buf = nullptr;
    std::size_t cap = 0;
    if (getline(&buf, &cap, from) <= 0) throw std::runtime_error("bench_dht: a worker died");
    std::string s(buf);
    std::free(buf);
    std::istringstream in(s);
    std::string ok;
    in >> ok;
    if (ok != "ok") throw std::runtime_error("bench_dht: worker: " + s);
    return in;
  }
  std::istringstream call(const std::string& line) {
    send(line);
    return receive();
  }
};

// Forks `n` workers; each child builds its NodeSet with `make` and runs worker_main. Call it
// before this process starts any thread (a forked child has only the forking thread).
template <class MakeSet>
std::vector<Worker> fork_workers(const Params& p, MakeSet make) {
  std::vector<Worker> ws;
  for (std::size_t first = 0; first < p.nodes; first += p.per_proc) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) throw std::runtime_error("bench_dht: pipe failed");
    std::cout.flush();
    std::cerr.flush();
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("bench_dht: fork failed");
    if (pid == 0) {
      for (auto& w : ws) {
        std::fclose(w.to);
        std::fclose(w.from);
      }
      close(down[1]);
      close(up[0]);
      FILE* in = fdopen(down[0], "r");
      FILE* out = fdopen(up[1], "w");
      int rc = 0;
      {
        std::unique_ptr<NodeSet> set = make();
        rc = worker_main(*set, p, in, out);
      }
      std::fflush(out);
      _exit(rc);
    }
    close(down[0]);
    close(up[1]);
    Worker w;
    w.pid = pid;
    w.to = fdopen(down[1], "w");
    w.from = fdopen(up[0], "r");
    w.first = first;
    w.count = std::min(p.per_proc, p.nodes - first);
    ws.push_back(w);
  }
  return ws;
}

inline void reap_workers(std::vector<Worker>& ws) {
  for (auto& w : ws) {
    std::fclose(w.to);
    std::fclose(w.from);
    int status = 0;
    waitpid(w.pid, &status, 0);
  }
}

}  // namespace bench
