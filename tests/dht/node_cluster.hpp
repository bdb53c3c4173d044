// Test support: many DhtNodes in one process, each on its own net::Host listening on a
// loopback port 0, all on one io_context. Every wait is bounded by the nodes' own deadlines.
//
// Threading rule: single-threaded; use from coroutines on the cluster's io_context.
#pragma once

#include <memory>
#include <random>
#include <vector>

#include "starling/dht/node.hpp"

namespace starling::dht::test {

// Small timeouts so a dead peer costs little even on a loaded machine, still far above the
// latency of loopback requests.
inline DhtNodeConfig quick_config(bool client = false) {
  DhtNodeConfig c;
  c.dht.client_mode = client;
  c.dht.request_timeout = 5s;
  c.dht.slow_request = 1s;
  c.dht.operation_timeout = 30s;
  c.bootstrap_attempts = 3;
  c.bootstrap_backoff = 200ms;
  c.stop_timeout = 5s;
  return c;
}

class NodeCluster {
 public:
  explicit NodeCluster(asio::any_io_executor ex) : ex_(std::move(ex)) {
    host_config.shutdown_timeout = 3s;
  }
  net::HostConfig host_config;  // for the hosts added from now on

  // Starts a host and a DHT node; bootstraps it through node 0 and one random earlier
  // server (none for the first node).
  awaitable<result<std::shared_ptr<DhtNode>>> add(DhtNodeConfig cfg) {
    net::HostConfig hc = host_config;
    auto host = net::Host::create(ex_, crypto::KeyPair::generate(), hc);
    ST_CO_TRY(co_await host->start());
    cfg.seed = ++seed_;
    auto node = DhtNode::create(host, cfg);
    std::vector<net::Multiaddr> seeds;
    if (!servers_.empty()) {
      seeds.push_back(addr(servers_.front()));
      std::uniform_int_distribution<std::size_t> pick(0, servers_.size() - 1);
      const std::size_t other = servers_[pick(rng_)];
      if (other != servers_.front()) seeds.push_back(addr(other));
    }
    hosts_.push_back(host);
    nodes_.push_back(node);
    if (!cfg.dht.client_mode) servers_.push_back(nodes_.size() - 1);
    ST_CO_TRY(co_await node->start(seeds));
    co_return node;
  }

  awaitable<result<void>> add_many(std::size_t n, DhtNodeConfig cfg = quick_config()) {
    for (std::size_t i = 0; i < n; ++i) ST_CO_TRY(co_await add(cfg));
    co_return success();
  }

  net::Host& host(std::size_t i) { return *hosts_.at(i); }
  std::shared_ptr<net::Host> host_ptr(std::size_t i) { return hosts_.at(i); }
  net::Multiaddr addr(std::size_t i) const { return hosts_.at(i)->listen_addresses().at(0); }
  DhtNode& node(std::size_t i) { return *nodes_.at(i); }
  std::shared_ptr<DhtNode> node_ptr(std::size_t i) { return nodes_.at(i); }
  std::size_t size() const { return nodes_.size(); }
  bool stopped(std::size_t i) const { return !nodes_.at(i)->running(); }

  // Stops one node and its host (bounded by their stop timeouts).
  awaitable<void> stop(std::size_t i) {
    co_await nodes_.at(i)->stop();
    co_await hosts_.at(i)->stop();
  }
  awaitable<void> stop_all() {
    for (std::size_t i = 0; i < nodes_.size(); ++i) co_await stop(i);
  }

 private:
  asio::any_io_executor ex_;
  std::vector<std::shared_ptr<net::Host>> hosts_;
  std::vector<std::shared_ptr<DhtNode>> nodes_;
  std::vector<std::size_t> servers_;
  std::mt19937_64 rng_{42};
  std::uint64_t seed_ = 0;
};

}  // namespace starling::dht::test
