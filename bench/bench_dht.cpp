// DHT benchmark: N nodes in one process on loopback, store and get latency and success, before
// and after stopping a fraction of the nodes, memory per node. `bench_dht starling ...` runs
// Starling's DhtNode (libp2p over TCP: Noise + yamux, one io thread per node);
// `bench_dht opendht ...` runs the anchor, OpenDHT, with the same N and operations (see
// bench_dht_opendht.hpp). Each prints one JSON object; bench/run-dht.sh runs both and compares.
//   bench_dht starling|opendht [--nodes N] [--ops K] [--churn F] [--seed S]
#include <iostream>

#include "bench_dht_opendht.hpp"
#include "bench_stats.hpp"
#include "starling/core/blocking.hpp"
#include "starling/core/log.hpp"
#include "starling/dht/node.hpp"

using namespace starling;
namespace sdht = starling::dht;
using namespace std::chrono;

namespace {

constexpr auto kTtl = sdht::Millis(600'000);

// One io thread per node, like OpenDHT's one thread per DhtRunner: the nodes do not queue
// behind each other, and each gets its own share of the CPU. The main thread drives the
// operations through block_on (a thread hop, as OpenDHT's callbacks are).
struct StarlingNet {
  bench::Params p;
  std::mt19937_64 rng;
  std::vector<std::unique_ptr<IoThread>> threads;
  std::vector<std::shared_ptr<net::Host>> hosts;
  std::vector<std::shared_ptr<sdht::DhtNode>> nodes;
  std::vector<net::Multiaddr> addrs;
  std::vector<bool> alive;
  std::vector<std::size_t> storer;
  std::vector<Bytes> values;
  bench::Report rep;

  std::size_t pick(std::size_t not_this) {
    for (;;) {
      const std::size_t i = std::uniform_int_distribution<std::size_t>(0, p.nodes - 1)(rng);
      if (i != not_this && alive[i]) return i;
    }
  }
  static sdht::RecordKey key(std::size_t k) {
    return sdht::RecordKey::from_string("bench-key-" + std::to_string(k));
  }
};

struct Started {
  std::shared_ptr<net::Host> host;
  std::shared_ptr<sdht::DhtNode> node;
};

awaitable<result<Started>> start_one(std::uint64_t seed, std::vector<net::Multiaddr> seeds) {
  net::HostConfig hc;
  hc.max_connections = 4096;
  auto host =
      net::Host::create(co_await asio::this_coro::executor, crypto::KeyPair::generate(), hc);
  ST_CO_TRY(co_await host->start());
  sdht::DhtNodeConfig cfg;
  cfg.seed = seed;
  auto node = sdht::DhtNode::create(host, cfg);
  ST_CO_TRY(co_await node->start(seeds));
  co_return Started{host, node};
}

awaitable<result<void>> stop_one(std::shared_ptr<net::Host> host,
                                 std::shared_ptr<sdht::DhtNode> node) {
  co_await node->stop();
  co_await host->stop();
  co_return success();
}

template <class T>
T must(result<T> r, const char* what) {
  if (!r) {
    std::cerr << "bench_dht: " << what << ": " << r.error().message() << "\n";
    std::exit(1);
  }
  return std::move(r).value();
}

void build(StarlingNet& n) {
  for (std::size_t i = 0; i < n.p.nodes; ++i) {
    n.threads.push_back(std::make_unique<IoThread>("dht-" + std::to_string(i)));
    std::vector<net::Multiaddr> seeds;
    if (i > 0) {
      seeds.push_back(n.addrs[0]);
      const std::size_t other = std::uniform_int_distribution<std::size_t>(0, i - 1)(n.rng);
      if (other) seeds.push_back(n.addrs[other]);
    }
    const std::uint64_t seed = n.p.seed * 1000 + i + 1;
    auto s =
        must(block_on(
                 n.threads[i]->executor(), [seed, seeds] { return start_one(seed, seeds); }, 120s),
             "start a node");
    n.addrs.push_back(s.host->listen_addresses().at(0));
    n.hosts.push_back(s.host);
    n.nodes.push_back(s.node);
    n.alive.push_back(true);
  }
}

void stores(StarlingNet& n, bench::Series& out, bool again) {
  for (std::size_t k = 0; k < n.p.ops; ++k) {
    if (!again) {
      n.values.emplace_back(64);
      n.storer.push_back(n.pick(n.p.nodes));
    }
    for (auto& b : n.values[k]) b = static_cast<std::uint8_t>(n.rng());
    const std::size_t s = n.storer[k];
    const auto t0 = steady_clock::now();
    auto r = block_on(
        n.threads[s]->executor(),
        [node = n.nodes[s], key = StarlingNet::key(k), v = n.values[k]] {
          return node->store(key, v, kTtl);
        },
        60s);
    out.add(r && r.value().replicas > 0, bench::ms_since(t0));
  }
}

void gets(StarlingNet& n, bench::Series& out) {
  for (std::size_t k = 0; k < n.p.ops; ++k) {
    const std::size_t g = n.pick(n.storer[k]);
    const auto t0 = steady_clock::now();
    auto r = block_on(
        n.threads[g]->executor(),
        [node = n.nodes[g], key = StarlingNet::key(k)] { return node->get(key); }, 60s);
    const bool ok = r && r.value() && r.value()->plain && r.value()->plain->value == n.values[k];
    out.add(ok, bench::ms_since(t0));
  }
}

void stop_node(StarlingNet& n, std::size_t i) {
  (void)block_on(
      n.threads[i]->executor(), [h = n.hosts[i], d = n.nodes[i]] { return stop_one(h, d); }, 30s);
  (void)n.threads[i]->stop();
  n.alive[i] = false;
}

bench::Report run_starling(const bench::Params& p) {
  StarlingNet n;
  n.p = p;
  n.rng.seed(p.seed);
  n.rep.system = "starling";
  n.rep.p = p;
  n.rep.rss_before_kib = bench::rss_kib();
  const auto t0 = steady_clock::now();
  build(n);
  n.rep.setup_s = bench::ms_since(t0) / 1000;
  stores(n, n.rep.store, false);
  stores(n, n.rep.store_again, true);
  gets(n, n.rep.get);
  n.rep.rss_after_kib = bench::rss_kib();
  for (auto v : bench::churn_victims(n.p, n.rng)) stop_node(n, v);
  gets(n, n.rep.get_after_churn);
  for (std::size_t i = 0; i < n.nodes.size(); ++i)
    if (n.alive[i]) stop_node(n, i);
  return n.rep;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: bench_dht starling|opendht [--nodes N] [--ops K] [--churn F] [--seed S]\n";
    return 2;
  }
  if (!std::getenv("STARLING_LOG")) set_log_level("error");
  const std::string which = argv[1];
  const bench::Params p = bench::parse_params(argc, argv, 2);
  bench::Report r;
  if (which == "starling")
    r = run_starling(p);
  else if (which == "opendht")
    r = bench::run_opendht(p);
  else
    return 2;
  std::cout << r.json().dump() << std::endl;
  return 0;
}
