// DHT benchmark: N nodes on loopback, split over worker processes of `--per-proc` nodes each
// (bench_dht_procs.hpp), store and get latency and success, before and after stopping a
// fraction of the nodes, memory per node. `bench_dht starling ...` runs Starling's DhtNode
// (bench_dht_starling.hpp); `bench_dht opendht ...` runs the anchor, OpenDHT, with the same N
// and operations (bench_dht_opendht.hpp). Each prints one JSON object; bench/run-dht.sh runs
// both and compares.
//   bench_dht starling|opendht [--nodes N] [--ops K] [--churn F] [--seed S] [--per-proc P]
//                              [--join-wait SECONDS]
#include <fstream>
#include <iostream>
#include <thread>

#include "bench_dht_opendht.hpp"
#include "bench_dht_procs.hpp"
#include "bench_dht_starling.hpp"
#include "starling/core/log.hpp"

using namespace std::chrono;

namespace bench {
namespace {

// The coordinator: the same operations as one process would run, one at a time.
struct Coordinator {
  Params p;
  std::vector<Worker> ws;
  Report rep;
  std::mt19937_64 rng;
  std::vector<bool> alive;
  std::vector<std::size_t> storer;
  std::vector<Blob> values;
  std::string phase;
  std::unique_ptr<std::ofstream> trace;  // BENCH_TRACE=file: one line per operation (appended)

  Worker& owner(std::size_t g) { return ws[g / p.per_proc]; }
  std::size_t pick(std::size_t not_this) {
    for (;;) {
      const std::size_t i = std::uniform_int_distribution<std::size_t>(0, p.nodes - 1)(rng);
      if (i != not_this && alive[i]) return i;
    }
  }
  void op(const char* what, std::size_t g, std::size_t k, Series& out) {
    Worker& w = owner(g);
    auto in = w.call(std::string(what) + ' ' + std::to_string(g - w.first) + ' ' +
                     std::to_string(k) + ' ' + hex(values[k]));
    int ok = 0;
    double ms = 0;
    std::uint64_t dials = 0;
    long hops = -1;
    in >> ok >> ms >> dials >> hops;
    out.add(ok == 1, ms, dials, hops);
    if (trace)
      *trace << rep.system << ' ' << phase << ' ' << g << ' ' << k << ' ' << ok << ' ' << ms << ' '
             << dials << ' ' << hops << '\n';
  }
  void setup() {
    const auto t0 = steady_clock::now();
    std::string addr0;
    ws[0].call("start 0 1") >> addr0;  // node 0 first: every other node joins through it
    for (auto& w : ws) {
      const std::size_t first = w.first == 0 ? 1 : w.first;
      const std::size_t count = w.first == 0 ? w.count - 1 : w.count;
      w.send("start " + std::to_string(first) + ' ' + std::to_string(count) + ' ' + addr0);
    }
    for (auto& w : ws) w.receive();
    for (auto& w : ws) w.send("join");
    for (auto& w : ws) w.receive();
    rep.setup_s = ms_since(t0) / 1000;
  }
  void stats(bool after) {
    long rss = 0;
    for (auto& w : ws) {
      long kib = 0, fds = 0;
      w.call("stats") >> kib >> fds;
      rss += kib;
      rep.max_fds = std::max(rep.max_fds, fds);
    }
    (after ? rep.rss_after_kib : rep.rss_before_kib) = rss;
  }
  // CPU seconds used by all workers, and connections opened by all live nodes, so far.
  std::pair<double, std::uint64_t> cpu() {
    double s = 0;
    std::uint64_t d = 0;
    for (auto& w : ws) {
      double c = 0;
      std::uint64_t n = 0;
      w.call("cpu") >> c >> n;
      s += c;
      d += n;
    }
    return {s, d};
  }
  void phase_end(Series& out, std::pair<double, std::uint64_t> c0) {
    const auto c1 = cpu();
    out.cpu_s = c1.first - c0.first;
    out.all_dials = c1.second >= c0.second ? c1.second - c0.second : 0;
  }
  // CPU the joined, idle nodes use (timers, keepalives, background dials), in cores.
  void idle() {
    const double c0 = cpu().first;
    const auto t0 = steady_clock::now();
    // BENCH_IDLE_S: a longer pause (to profile the idle nodes).
    const char* e = std::getenv("BENCH_IDLE_S");
    std::this_thread::sleep_for(duration<double>(e ? std::strtod(e, nullptr) : 3.0));
    rep.idle_cores = (cpu().first - c0) / (ms_since(t0) / 1000);
  }
  void stores(Series& out, bool again) {
    const auto c0 = cpu();
    for (std::size_t k = 0; k < p.ops; ++k) {
      if (!again) {
        values.emplace_back(64);
        storer.push_back(pick(p.nodes));
      }
      for (auto& b : values[k]) b = static_cast<std::uint8_t>(rng());
      op("store", storer[k], k, out);
    }
    phase_end(out, c0);
  }
  void gets(Series& out) {
    const auto c0 = cpu();
    for (std::size_t k = 0; k < p.ops; ++k) op("get", pick(storer[k]), k, out);
    phase_end(out, c0);
  }
  void churn() {
    std::vector<std::size_t> sent(ws.size());
    for (auto v : churn_victims(p, rng)) {
      owner(v).send("kill " + std::to_string(v - owner(v).first));
      ++sent[v / p.per_proc];
      alive[v] = false;
    }
    for (std::size_t i = 0; i < ws.size(); ++i)
      for (std::size_t j = 0; j < sent[i]; ++j) ws[i].receive();
  }
};

template <class MakeSet>
Report run(const Params& p, const std::string& system, MakeSet make) {
  Coordinator c;
  c.p = p;
  c.ws = fork_workers(p, make);
  c.rng.seed(p.seed);
  c.alive.assign(p.nodes, true);
  c.rep.system = system;
  c.rep.p = p;
  c.rep.procs = c.ws.size();
  if (const char* t = std::getenv("BENCH_TRACE"))
    c.trace = std::make_unique<std::ofstream>(t, std::ios::app);
  c.setup();
  c.idle();
  c.stats(false);  // rss_before counts the join too: the node's whole cost
  c.rep.rss_before_kib = 0;
  c.phase = "store";
  c.stores(c.rep.store, false);
  c.phase = "store_again";
  c.stores(c.rep.store_again, true);
  c.phase = "get";
  c.gets(c.rep.get);
  c.stats(true);
  c.churn();
  c.phase = "get_after_churn";
  c.gets(c.rep.get_after_churn);
  for (auto& w : c.ws) w.send("quit");
  for (auto& w : c.ws) w.receive();
  reap_workers(c.ws);
  return c.rep;
}

}  // namespace
}  // namespace bench

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: bench_dht starling|opendht [--nodes N] [--ops K] [--churn F] [--seed S] "
                 "[--per-proc P] [--join-wait S]\n";
    return 2;
  }
  if (!std::getenv("STARLING_LOG")) starling::set_log_level("error");
  const std::string which = argv[1];
  const bench::Params p = bench::parse_params(argc, argv, 2);
  bench::Report r;
  try {
    if (which == "starling")
      r = bench::run(p, which, [p] { return std::make_unique<bench::StarlingSet>(p); });
    else if (which == "opendht")
      r = bench::run(p, which, [p] { return std::make_unique<bench::OpenDhtSet>(p); });
    else
      return 2;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  std::cout << r.json().dump() << std::endl;
  return 0;
}
