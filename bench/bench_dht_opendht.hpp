// The anchor of the DHT benchmark: OpenDHT (libopendht), the same node count on loopback UDP,
// the same operations (put a 64-byte value under a key through one node, get it through
// another, again after stopping a fraction of the nodes). Rate limits are off (every node
// shares 127.0.0.1) and a private network id keeps it off any public network.
#pragma once

#include <future>
#include <memory>

#include <opendht.h>

#include "bench_stats.hpp"

namespace bench {

inline Report run_opendht(const Params& p) {
  using namespace std::chrono;
  Report rep;
  rep.system = "opendht";
  rep.p = p;
  std::mt19937_64 rng(p.seed);
  rep.rss_before_kib = rss_kib();
  const auto t0 = steady_clock::now();
  std::vector<std::unique_ptr<dht::DhtRunner>> nodes;
  for (std::size_t i = 0; i < p.nodes; ++i) {
    auto n = std::make_unique<dht::DhtRunner>();
    dht::DhtRunner::Config cfg;
    cfg.dht_config.node_config.network = 0x5717;
    cfg.dht_config.node_config.max_req_per_sec = -1;
    cfg.dht_config.node_config.max_peer_req_per_sec = -1;
    cfg.threaded = true;
    n->run(0, cfg);
    if (i > 0) {
      n->bootstrap("127.0.0.1", std::to_string(nodes[0]->getBoundPort(AF_INET)));
      const std::size_t other = std::uniform_int_distribution<std::size_t>(0, i - 1)(rng);
      if (other) n->bootstrap("127.0.0.1", std::to_string(nodes[other]->getBoundPort(AF_INET)));
    }
    nodes.push_back(std::move(n));
  }
  // Joined: every node knows a few good nodes (bounded wait).
  const std::size_t want = std::min<std::size_t>(8, p.nodes - 1);
  const auto join_deadline = steady_clock::now() + 120s;
  for (auto& n : nodes)
    while (n->getNodesStats(AF_INET).good_nodes < want && steady_clock::now() < join_deadline)
      std::this_thread::sleep_for(20ms);
  rep.setup_s = ms_since(t0) / 1000;

  std::vector<dht::InfoHash> keys;
  std::vector<dht::Blob> values;
  std::vector<bool> alive(p.nodes, true);
  auto pick = [&](std::size_t not_this) {
    for (;;) {
      const std::size_t i = std::uniform_int_distribution<std::size_t>(0, p.nodes - 1)(rng);
      if (i != not_this && alive[i]) return i;
    }
  };
  std::vector<std::size_t> storer;
  for (std::size_t k = 0; k < p.ops; ++k) {
    keys.push_back(dht::InfoHash::get("bench-key-" + std::to_string(k)));
    dht::Blob v(64);
    for (auto& b : v) b = static_cast<std::uint8_t>(rng());
    values.push_back(v);
    const std::size_t s = pick(p.nodes);
    storer.push_back(s);
    std::promise<bool> done;
    auto fut = done.get_future();
    const auto ts = steady_clock::now();
    nodes[s]->put(keys[k], dht::Value(v), [&done](bool ok) { done.set_value(ok); });
    const bool ok = fut.wait_for(30s) == std::future_status::ready && fut.get();
    rep.store.add(ok, ms_since(ts));
  }
  // The same keys again, through the same nodes (new values).
  for (std::size_t k = 0; k < p.ops; ++k) {
    for (auto& b : values[k]) b = static_cast<std::uint8_t>(rng());
    std::promise<bool> done;
    auto fut = done.get_future();
    const auto ts = steady_clock::now();
    nodes[storer[k]]->put(keys[k], dht::Value(values[k]), [&done](bool ok) { done.set_value(ok); });
    const bool ok = fut.wait_for(30s) == std::future_status::ready && fut.get();
    rep.store_again.add(ok, ms_since(ts));
  }
  auto get_round = [&](Series& out) {
    for (std::size_t k = 0; k < p.ops; ++k) {
      const std::size_t g = pick(storer[k]);
      auto found = std::make_shared<std::promise<double>>();
      auto fut = found->get_future();
      auto once = std::make_shared<std::once_flag>();
      const auto ts = steady_clock::now();
      const dht::Blob want_v = values[k];
      nodes[g]->get(
          keys[k],
          [found, once, ts, want_v](const std::vector<std::shared_ptr<dht::Value>>& vs) {
            for (const auto& v : vs)
              if (v->data == want_v) {
                std::call_once(*once, [&] { found->set_value(ms_since(ts)); });
                return false;  // found: stop the search
              }
            return true;
          },
          [found, once](bool) { std::call_once(*once, [&] { found->set_value(-1); }); });
      double ms = -1;
      if (fut.wait_for(30s) == std::future_status::ready) ms = fut.get();
      out.add(ms >= 0, ms);
    }
  };
  get_round(rep.get);
  rep.rss_after_kib = rss_kib();
  for (auto v : churn_victims(p, rng)) {
    nodes[v]->join();  // stops its thread and closes its socket
    alive[v] = false;
  }
  get_round(rep.get_after_churn);
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (alive[i]) nodes[i]->shutdown();
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (alive[i]) nodes[i]->join();
  return rep;
}

}  // namespace bench
