// Starling's side of the DHT benchmark: one worker's DhtNodes (libp2p over TCP: Noise + yamux),
// one io thread per node, like OpenDHT's one thread per DhtRunner: the nodes do not queue
// behind each other. The worker's main thread drives each operation through block_on (a
// thread hop, as OpenDHT's callbacks are) and times it.
#pragma once

#include <sys/resource.h>

#include <thread>

#include "bench_dht_procs.hpp"
#include "starling/core/allocator.hpp"
#include "starling/core/blocking.hpp"
#include "starling/dht/node.hpp"

namespace bench {

namespace sdht = starling::dht;

class StarlingSet : public NodeSet {
 public:
  explicit StarlingSet(const Params& p) {
    // In the worker process, as `starling` does at startup (cli_main); BENCH_FASTBINS=1 keeps
    // glibc's default to measure the difference.
    if (const char* e = std::getenv("BENCH_FASTBINS"); !e || std::atoi(e) == 0)
      starling::tune_allocator();
    per_proc_ = p.per_proc;
    nodes_total_ = p.nodes;
  }
  std::string start_node(std::uint64_t seed, const std::vector<std::string>& seeds) override {
    using namespace std::chrono;
    std::vector<starling::net::Multiaddr> addrs;
    for (const auto& s : seeds) addrs.push_back(must(starling::net::Multiaddr::parse(s), "seed"));
    threads_.push_back(std::make_unique<starling::IoThread>("dht-" + std::to_string(seed)));
    auto s = must(
        starling::block_on(
            threads_.back()->executor(), [seed, addrs] { return start_one(seed, addrs); }, 120s),
        "start a node");
    hosts_.push_back(s.host);
    nodes_.push_back(s.node);
    return s.host->listen_addresses().at(0).with_peer_id(s.host->local_peer()).to_string();
  }

  // Joined = every node's warm connections are up, no learned node waits for admission and
  // no refresh round runs (or max_s passed).
  void wait_joined(double max_s) override {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      for (;;) {
        auto w = starling::block_on(
            threads_[i]->executor(),
            [d = nodes_[i]]() -> starling::awaitable<starling::result<sdht::WarmStats>> {
              co_return d->warm_stats();
            },
            std::chrono::seconds(10));
        if (!w || (w.value().dialing == 0 && w.value().connected >= w.value().wanted &&
                   w.value().admitting == 0 && !w.value().refreshing)) {
          if (w && std::getenv("BENCH_DEBUG"))
            std::cerr << "node " << i << ": table " << w.value().table << ", connections "
                      << w.value().connections << ", warm " << w.value().connected << "/"
                      << w.value().wanted << "\n";
          break;
        }
        if (ms_since(t0) > max_s * 1000) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }

  Outcome store(std::size_t i, std::size_t k, const Blob& v) override {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = starling::block_on(
        threads_[i]->executor(),
        [node = nodes_[i], key = key_of(k), v] {
          return node->store(key, v, sdht::Millis(600'000));
        },
        std::chrono::seconds(60));
    return {r && r.value().replicas > 0, ms_since(t0), -1};
  }

  Outcome get(std::size_t i, std::size_t k, const Blob& want) override {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = starling::block_on(
        threads_[i]->executor(), [node = nodes_[i], key = key_of(k)] { return node->get(key); },
        std::chrono::seconds(60));
    const double ms = ms_since(t0);
    const bool ok = r && r.value() && r.value()->plain && r.value()->plain->value == want;
    // Failures in the trace's hop column: -2 another value, -3 not found, -4 an error.
    const long hops = ok ? static_cast<long>(r.value()->hops) : !r ? -4 : !r.value() ? -3 : -2;
    return {ok, ms, hops};
  }

  std::uint64_t dials(std::size_t i) const override {
    std::uint64_t n = 0;  // read on the node's thread
    auto r = starling::block_on(
        threads_[i]->executor(),
        [h = hosts_[i], &n]() -> starling::awaitable<starling::result<void>> {
          n = h->stats().outbound_connections;
          co_return starling::success();
        },
        std::chrono::seconds(10));
    return r ? n : 0;
  }

  void stop_node(std::size_t i) override {
    (void)starling::block_on(
        threads_[i]->executor(), [h = hosts_[i], d = nodes_[i]] { return stop_one(h, d); },
        std::chrono::seconds(30));
    (void)threads_[i]->stop();
    stopped_.resize(nodes_.size());
    stopped_[i] = true;
  }

  void stop_all() override {
    stopped_.resize(nodes_.size());
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (!stopped_[i]) stop_node(i);
  }

 private:
  struct Started {
    std::shared_ptr<starling::net::Host> host;
    std::shared_ptr<sdht::DhtNode> node;
  };

  template <class T>
  static T must(starling::result<T> r, const char* what) {
    if (!r) {
      std::cerr << "bench_dht: " << what << ": " << r.error().message() << "\n";
      std::exit(1);
    }
    return std::move(r).value();
  }

  // Warm connections per node: the default, or less when the fd limit of a worker would not
  // allow it (a node holds at most min(2 x this, N - 1) connections, see DhtNodeConfig).
  // BENCH_WARM overrides.
  static std::size_t warm_cap() {
    if (const char* e = std::getenv("BENCH_WARM")) return std::strtoul(e, nullptr, 10);
    rlimit rl{};
    std::size_t cap = sdht::DhtNodeConfig{}.warm_connections;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && per_proc_ > 0) {
      const std::size_t budget = rl.rlim_cur * 8 / 10 / per_proc_;  // connections per node
      if (nodes_total_ > budget) cap = std::min(cap, budget / 2);
    }
    return cap;
  }

  static sdht::RecordKey key_of(std::size_t k) {
    return sdht::RecordKey::from_string("bench-key-" + std::to_string(k));
  }

  static starling::awaitable<starling::result<Started>> start_one(
      std::uint64_t seed, std::vector<starling::net::Multiaddr> seeds) {
    starling::net::HostConfig hc;
    hc.max_connections = 4096;
    auto host = starling::net::Host::create(co_await asio::this_coro::executor,
                                            starling::crypto::KeyPair::generate(), hc);
    ST_CO_TRY(co_await host->start());
    sdht::DhtNodeConfig cfg;
    cfg.seed = seed;
    cfg.warm_connections = warm_cap();
    // BENCH_ADMIT=1: admission of lookup-learned nodes (DhtConfig::admit_learned, off by default).
    if (const char* e = std::getenv("BENCH_ADMIT")) cfg.dht.admit_learned = std::atoi(e) != 0;
    // BENCH_GET_DIALS=n: DhtConfig::get_dials (dials a get keeps in flight; 0 = no limit).
    if (const char* e = std::getenv("BENCH_GET_DIALS"))
      cfg.dht.get_dials = std::strtoul(e, nullptr, 10);
    // BENCH_REFRESH=1: refresh rounds (DhtConfig::refresh_splits, refresh_growth = 2; off by
    // default).
    if (const char* e = std::getenv("BENCH_REFRESH"); e && std::atoi(e) != 0) {
      cfg.dht.refresh_splits = true;
      cfg.dht.refresh_growth = 2.0;
    }
    auto node = sdht::DhtNode::create(host, cfg);
    ST_CO_TRY(co_await node->start(seeds));
    co_return Started{host, node};
  }

  static starling::awaitable<starling::result<void>> stop_one(
      std::shared_ptr<starling::net::Host> host, std::shared_ptr<sdht::DhtNode> node) {
    co_await node->stop();
    co_await host->stop();
    co_return starling::success();
  }

  std::vector<std::unique_ptr<starling::IoThread>> threads_;
  std::vector<std::shared_ptr<starling::net::Host>> hosts_;
  std::vector<std::shared_ptr<sdht::DhtNode>> nodes_;
  std::vector<bool> stopped_;
  static inline std::size_t per_proc_ = 0, nodes_total_ = 0;
};

}  // namespace bench
