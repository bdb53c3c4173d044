// DHT benchmark: N nodes in one process on loopback, store and get latency and success, before
// and after stopping a fraction of the nodes, memory per node. `bench_dht starling ...` runs
// Starling's DhtNode (libp2p over TCP: Noise + yamux, all nodes on one io thread);
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

struct StarlingNet {
  bench::Params p;
  std::mt19937_64 rng;
  std::vector<std::shared_ptr<net::Host>> hosts;
  std::vector<std::shared_ptr<sdht::DhtNode>> nodes;
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

awaitable<result<void>> build(StarlingNet* n) {
  auto ex = co_await asio::this_coro::executor;
  for (std::size_t i = 0; i < n->p.nodes; ++i) {
    net::HostConfig hc;
    hc.max_connections = 4096;
    auto host = net::Host::create(ex, crypto::KeyPair::generate(), hc);
    ST_CO_TRY(co_await host->start());
    sdht::DhtNodeConfig cfg;
    cfg.seed = n->p.seed * 1000 + i + 1;
    auto node = sdht::DhtNode::create(host, cfg);
    std::vector<net::Multiaddr> seeds;
    if (i > 0) {
      seeds.push_back(n->hosts[0]->listen_addresses().at(0));
      const std::size_t other = std::uniform_int_distribution<std::size_t>(0, i - 1)(n->rng);
      if (other) seeds.push_back(n->hosts[other]->listen_addresses().at(0));
    }
    n->hosts.push_back(host);
    n->nodes.push_back(node);
    n->alive.push_back(true);
    ST_CO_TRY(co_await node->start(seeds));
  }
  co_return success();
}

awaitable<result<void>> stores(StarlingNet* n) {
  for (std::size_t k = 0; k < n->p.ops; ++k) {
    Bytes v(64);
    for (auto& b : v) b = static_cast<std::uint8_t>(n->rng());
    n->values.push_back(v);
    const std::size_t s = n->pick(n->p.nodes);
    n->storer.push_back(s);
    const auto t0 = steady_clock::now();
    auto r = co_await n->nodes[s]->store(StarlingNet::key(k), v, sdht::Millis(600'000));
    n->rep.store.add(r && r.value().replicas > 0, bench::ms_since(t0));
  }
  co_return success();
}

// The same keys again, through the same nodes: their connections to the replicas are open now.
awaitable<result<void>> stores_again(StarlingNet* n) {
  for (std::size_t k = 0; k < n->p.ops; ++k) {
    for (auto& b : n->values[k]) b = static_cast<std::uint8_t>(n->rng());
    const auto t0 = steady_clock::now();
    auto r = co_await n->nodes[n->storer[k]]->store(StarlingNet::key(k), n->values[k],
                                                     sdht::Millis(600'000));
    n->rep.store_again.add(r && r.value().replicas > 0, bench::ms_since(t0));
  }
  co_return success();
}

awaitable<result<void>> gets(StarlingNet* n, bench::Series* out) {
  for (std::size_t k = 0; k < n->p.ops; ++k) {
    const std::size_t g = n->pick(n->storer[k]);
    const auto t0 = steady_clock::now();
    auto r = co_await n->nodes[g]->get(StarlingNet::key(k));
    const bool ok = r && r.value() && r.value()->plain && r.value()->plain->value == n->values[k];
    out->add(ok, bench::ms_since(t0));
  }
  co_return success();
}

awaitable<result<void>> churn(StarlingNet* n) {
  for (auto v : bench::churn_victims(n->p, n->rng)) {
    co_await n->nodes[v]->stop();
    co_await n->hosts[v]->stop();
    n->alive[v] = false;
  }
  co_return success();
}

awaitable<result<void>> shutdown_all(StarlingNet* n) {
  for (std::size_t i = 0; i < n->nodes.size(); ++i) {
    if (!n->alive[i]) continue;
    co_await n->nodes[i]->stop();
    co_await n->hosts[i]->stop();
  }
  co_return success();
}

template <class F>
void must(IoThread& io, F f, const char* what) {
  auto r = block_on(io.executor(), std::move(f), 600s);
  if (!r) {
    std::cerr << "bench_dht: " << what << ": " << r.error().message() << "\n";
    std::exit(1);
  }
}

bench::Report run_starling(const bench::Params& p) {
  StarlingNet n{p, std::mt19937_64(p.seed), {}, {}, {}, {}, {}, {}};
  n.rep.system = "starling";
  n.rep.p = p;
  IoThread io("bench-dht");
  n.rep.rss_before_kib = bench::rss_kib();
  const auto t0 = steady_clock::now();
  must(io, [&n] { return build(&n); }, "build");
  n.rep.setup_s = bench::ms_since(t0) / 1000;
  must(io, [&n] { return stores(&n); }, "stores");
  must(io, [&n] { return stores_again(&n); }, "stores again");
  must(io, [&n] { return gets(&n, &n.rep.get); }, "gets");
  n.rep.rss_after_kib = bench::rss_kib();
  must(io, [&n] { return churn(&n); }, "churn");
  must(io, [&n] { return gets(&n, &n.rep.get_after_churn); }, "gets after churn");
  must(io, [&n] { return shutdown_all(&n); }, "shutdown");
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
  if (which == "starling") r = run_starling(p);
  else if (which == "opendht") r = bench::run_opendht(p);
  else return 2;
  std::cout << r.json().dump() << std::endl;
  return 0;
}
