// Test support: N averaging nodes in one process, each a real libp2p Host on 127.0.0.1 (port 0)
// with its own io_context and thread (so one node can be stalled, like a SIGSTOPped process),
// sharing a MemoryDirectory.
#pragma once

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <future>
#include <random>
#include <thread>

#include "starling/averaging/averager.hpp"
#include "starling/averaging/host_address_sink.hpp"
#include "starling/net/host.hpp"

namespace starling::averaging::test {

// co_spawn(..., use_future) needs a default-constructible value; results are not.
template <class F>
auto spawn_future(asio::io_context& io, F f) {
  using A = decltype(f());
  using T = typename A::value_type;
  auto p = std::make_shared<std::promise<T>>();
  auto fut = p->get_future();
  asio::co_spawn(
      io, [p, f = std::move(f)]() mutable -> awaitable<void> { p->set_value(co_await f()); },
      asio::detached);
  return fut;
}

struct NodeOptions {
  std::uint64_t bandwidth = 100'000'000;
  bool client = false;
  std::function<void(AveragerConfig&)> configure;  // per-node changes to the base config
};

struct Node {
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
  std::thread thread;
  std::promise<void> ran_out;  // io.run() returned: no work left (or stopped)
  std::shared_ptr<net::Host> host;
  std::shared_ptr<Averager> avg;
  std::vector<std::vector<float>> tensors;
  std::vector<float> initial_flat;
  bool killed = false;

  // Runs `f` (a coroutine factory) on the node's thread and waits for its value.
  template <class F>
  auto run(F f) {
    return spawn_future(io, std::move(f)).get();
  }
};

inline Schema test_schema(std::size_t scale) {
  return Schema{{{"w", {static_cast<std::int64_t>(scale), 3}, DType::f32},
                 {"b", {static_cast<std::int64_t>(scale / 7 + 1)}, DType::f32},
                 {"s", {}, DType::f32}},
                "none"};
}

// A config for loopback clusters on a busy 2-core machine (generous timeouts, fast
// matchmaking).
// Tells `host` where group members listen (the library's sink).
inline Averager::AddressSink address_sink(const std::shared_ptr<net::Host>& host) {
  return host_address_sink(host);
}

inline AveragerConfig base_config() {
  AveragerConfig c;
  c.key = {"test", 16, 0};
  c.round.part_elems = 4096;
  c.round.stall_timeout = 4s;
  c.keepalive_interval = 500ms;
  c.open_timeout = 30s;  // 16 nodes dialling each other under sanitizers on 2 busy cores
  c.matchmaking.min_wait = 1s;
  c.matchmaking.settle = 300ms;
  c.matchmaking.refresh_interval = 200ms;
  return c;
}

class Cluster {
 public:
  // `dir`: the directory every node uses (default: directory(), a MemoryDirectory; with `dir`
  // given, directory() is not the one in use).
  Cluster(std::size_t n, Schema schema, AveragerConfig base, std::vector<NodeOptions> opts = {},
          std::uint64_t seed = 1, std::shared_ptr<Directory> dir = nullptr)
      : schema_(std::move(schema)),
        dir_(std::make_shared<MemoryDirectory>()),
        used_dir_(dir ? std::move(dir) : dir_) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> vd(-2.0f, 2.0f);
    for (std::size_t i = 0; i < n; ++i) {
      auto node = std::make_unique<Node>();
      node->guard.emplace(node->io.get_executor());
      node->thread = std::thread([n = node.get()] {
        n->io.run();
        n->ran_out.set_value();
      });
      net::HostConfig hc;
      node->host = net::Host::create(node->io.get_executor(), crypto::KeyPair::generate(), hc);
      auto started = node->run(
          [h = node->host]() -> awaitable<result<void>> { co_return co_await h->start(); });
      if (!started) throw std::runtime_error(started.error().message());
      for (const auto& t : schema_.tensors) {
        std::vector<float> v(t.numel());
        for (auto& x : v) x = vd(rng);
        node->tensors.push_back(std::move(v));
      }
      std::vector<TensorView> views;
      for (std::size_t t = 0; t < schema_.tensors.size(); ++t)
        views.push_back({schema_.tensors[t].name, node->tensors[t]});
      node->initial_flat.resize(schema_.numel());
      gather_flat(views, 0, node->initial_flat);
      AveragerConfig cfg = base;
      const NodeOptions o = i < opts.size() ? opts[i] : NodeOptions{};
      cfg.bandwidth = o.bandwidth;
      cfg.client_mode = o.client;
      if (o.configure) o.configure(cfg);
      for (const auto& a : node->host->listen_addresses()) cfg.addrs.push_back(a.to_string());
      cfg.seed = seed * 1000 + i + 1;
      cfg.on_phase = [this, i](const std::string& ph) {
        if (phases_on_ && on_phase) on_phase(i, ph);
      };
      auto avg =
          Averager::create(node->host, used_dir_, schema_, views, cfg, address_sink(node->host));
      if (!avg) throw std::runtime_error(avg.error().message());
      node->avg = avg.value();
      node->run([a = node->avg]() -> awaitable<int> {
        a->start();
        co_return 0;
      });
      nodes_.push_back(std::move(node));
    }
  }

  ~Cluster() {
    // The test's hook may capture its locals, destroyed before the cluster: no phase of the
    // shutdown below reaches it.
    phases_on_ = false;
    for (auto& n : nodes_) {
      if (!n->killed)
        n->run([n = n.get()]() -> awaitable<int> {
          co_await n->avg->stop();
          co_await n->host->stop();
          co_return 0;
        });
      n->avg.reset();
      n->host.reset();
      // Let the coroutines that are still finishing (sessions closing after the host stopped)
      // run to their end: destroying an io_context with suspended coroutines frees their
      // frames in no particular order, and a TaskScope destroyed then emits cancellations into
      // frames already freed (ASan: heap-use-after-free). Bounded: stop after 20 s.
      auto done = n->ran_out.get_future();
      n->guard.reset();
      if (done.wait_for(20s) != std::future_status::ready) n->io.stop();
      n->thread.join();
    }
  }

  // Test hook, called on node i's thread when its step enters a phase. Set before stepping.
  std::function<void(std::size_t node, const std::string& phase)> on_phase;

 private:
  std::atomic<bool> phases_on_{true};

 public:
  Node& node(std::size_t i) { return *nodes_[i]; }
  std::size_t size() const { return nodes_.size(); }
  const Schema& schema() const { return schema_; }
  std::shared_ptr<MemoryDirectory> directory() const { return dir_; }

  // A group with every node in the order given, as matchmaking would build it.
  GroupInfo group(const std::vector<double>& weights) {
    GroupInfo g;
    g.group_id = Bytes(16, 7);
    g.schema_hash = schema_hash(schema_);
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      auto m = nodes_[i]->avg->self_info(weights.at(i));
      g.members.push_back(m);
    }
    return g;
  }

  // Runs step(opts[i]) on every node at once (skipping killed ones); returns each result.
  std::vector<result<StepResult>> step_all(const std::vector<StepOptions>& opts) {
    std::vector<std::future<result<StepResult>>> fs(nodes_.size());
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i]->killed) continue;
      fs[i] =
          spawn_future(nodes_[i]->io, [a = nodes_[i]->avg, o = opts[i]]() { return a->step(o); });
    }
    std::vector<result<StepResult>> out;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (!fs[i].valid()) {
        out.push_back(make_error(errc::cancelled, "killed"));
        continue;
      }
      if (fs[i].wait_for(180s) != std::future_status::ready)
        throw std::runtime_error("step did not return within 180 s");
      out.push_back(fs[i].get());
    }
    return out;
  }

  // Flattened current tensors of node i.
  std::vector<float> flat(std::size_t i) {
    std::vector<TensorView> views;
    for (std::size_t t = 0; t < schema_.tensors.size(); ++t)
      views.push_back({schema_.tensors[t].name, nodes_[i]->tensors[t]});
    std::vector<float> out(schema_.numel());
    gather_flat(views, 0, out);
    return out;
  }

  // Overwrites node i's tensors (between steps only: the node's thread is idle then).
  void set_flat(std::size_t i, const std::vector<float>& v) {
    std::vector<TensorView> views;
    for (std::size_t t = 0; t < schema_.tensors.size(); ++t)
      views.push_back({schema_.tensors[t].name, nodes_[i]->tensors[t]});
    scatter_flat(views, 0, v);
  }

  // Crashes node i from its own thread: the host stops (connections close).
  void kill(std::size_t i) {
    auto& n = *nodes_[i];
    if (n.killed) return;
    n.killed = true;
    asio::co_spawn(
        n.io,
        [h = n.host, a = n.avg]() -> awaitable<void> {
          co_await a->stop();
          co_await h->stop();
        },
        asio::detached);
  }
  // Blocks node i's thread for `d` (no keepalives, no reads: a stalled process).
  void stall(std::size_t i, Duration d) {
    asio::post(nodes_[i]->io, [d] { std::this_thread::sleep_for(d); });
  }

 private:
  Schema schema_;
  std::shared_ptr<MemoryDirectory> dir_;
  std::shared_ptr<Directory> used_dir_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

// A config for state-transfer tests: parts of 4096 elements (a state spans many parts),
// generous connection timeouts; `prefix` keeps each test's DHT keys apart.
inline AveragerConfig state_config(const std::string& prefix) {
  AveragerConfig c;
  c.key = {prefix, 16, 0};
  c.round.part_elems = 4096;
  c.open_timeout = std::chrono::seconds(20);
  return c;
}

// Node i shares its tensors as the state of `epoch` with metadata `meta` (ttl 60 s).
inline result<void> share_state(Cluster& c, std::size_t i, std::uint64_t epoch, std::string meta) {
  return c.node(i).run([a = c.node(i).avg, epoch, meta]() {
    return a->share_state(epoch, to_bytes(meta), std::chrono::seconds(60));
  });
}

// Copies node `from`'s tensors into node `to`'s, in place (the averager holds views of them).
inline void copy_tensors(Cluster& c, std::size_t from, std::size_t to) {
  for (std::size_t t = 0; t < c.node(to).tensors.size(); ++t)
    std::copy(c.node(from).tensors[t].begin(), c.node(from).tensors[t].end(),
              c.node(to).tensors[t].begin());
}

}  // namespace starling::averaging::test
