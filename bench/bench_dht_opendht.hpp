// The anchor of the DHT benchmark: OpenDHT (libopendht), one worker's nodes on loopback UDP, one
// DhtRunner thread per node, the same operations (put a 64-byte value under a key through one
// node, get it through another, again after stopping a fraction of the nodes). Rate limits are
// off (every node shares 127.0.0.1) and a private network id keeps it off any public network.
#pragma once

#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include <opendht.h>

#include "bench_dht_procs.hpp"

namespace bench {

class OpenDhtSet : public NodeSet {
 public:
  explicit OpenDhtSet(const Params& p) : p_(p) {}

  std::string start_node(std::uint64_t, const std::vector<std::string>& seeds) override {
    auto n = std::make_unique<dht::DhtRunner>();
    dht::DhtRunner::Config cfg;
    cfg.dht_config.node_config.network = 0x5717;
    cfg.dht_config.node_config.max_req_per_sec = -1;
    cfg.dht_config.node_config.max_peer_req_per_sec = -1;
    cfg.threaded = true;
    n->run(0, cfg);
    for (const auto& s : seeds) {
      const auto colon = s.rfind(':');
      n->bootstrap(s.substr(0, colon), s.substr(colon + 1));
    }
    const auto port = n->getBoundPort(AF_INET);
    nodes_.push_back(std::move(n));
    alive_.push_back(true);
    return "127.0.0.1:" + std::to_string(port);
  }

  // Joined: every node knows a few good nodes (bounded wait).
  void wait_joined(double max_s) override {
    using namespace std::chrono;
    const std::size_t want = std::min<std::size_t>(8, p_.nodes - 1);
    const auto deadline = steady_clock::now() + duration<double>(max_s);
    for (auto& n : nodes_)
      while (n->getNodesStats(AF_INET).good_nodes < want && steady_clock::now() < deadline)
        std::this_thread::sleep_for(20ms);
  }

  Outcome store(std::size_t i, std::size_t k, const Blob& v) override {
    std::promise<bool> done;
    auto fut = done.get_future();
    const auto t0 = std::chrono::steady_clock::now();
    nodes_[i]->put(key_of(k), dht::Value(v), [&done](bool ok) { done.set_value(ok); });
    const bool ok =
        fut.wait_for(std::chrono::seconds(30)) == std::future_status::ready && fut.get();
    return {ok, ms_since(t0), -1};
  }

  Outcome get(std::size_t i, std::size_t k, const Blob& want) override {
    auto found = std::make_shared<std::promise<double>>();
    auto fut = found->get_future();
    auto once = std::make_shared<std::once_flag>();
    const auto t0 = std::chrono::steady_clock::now();
    nodes_[i]->get(
        key_of(k),
        [found, once, t0, want](const std::vector<std::shared_ptr<dht::Value>>& vs) {
          for (const auto& v : vs)
            if (v->data == want) {
              std::call_once(*once, [&] { found->set_value(ms_since(t0)); });
              return false;  // found: stop the search
            }
          return true;
        },
        [found, once](bool) { std::call_once(*once, [&] { found->set_value(-1); }); });
    double ms = -1;
    if (fut.wait_for(std::chrono::seconds(30)) == std::future_status::ready) ms = fut.get();
    return {ms >= 0, ms, -1};
  }

  void stop_node(std::size_t i) override {
    nodes_[i]->join();  // stops its thread and closes its socket
    alive_[i] = false;
  }

  void stop_all() override {
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (alive_[i]) nodes_[i]->shutdown();
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (alive_[i]) stop_node(i);
  }

 private:
  static dht::InfoHash key_of(std::size_t k) {
    return dht::InfoHash::get("bench-key-" + std::to_string(k));
  }

  Params p_;
  std::vector<std::unique_ptr<dht::DhtRunner>> nodes_;
  std::vector<bool> alive_;
};

}  // namespace bench
