// Test support: expert servers on in-process DHT nodes over loopback, one io thread.
#pragma once

#include <chrono>

#include <gtest/gtest.h>
#include <set>
#include <thread>

#include "dht/node_cluster.hpp"
#include "starling/averaging/dht_directory.hpp"
#include "starling/core/blocking.hpp"
#include "starling/moe/expert_server.hpp"
#include "starling/moe/remote.hpp"

namespace starling::moe::test {

using dht::test::NodeCluster;
using dht::test::quick_config;

constexpr std::int64_t kDim = 8;
constexpr std::int64_t kHidden = 16;
constexpr double kLr = 0.1;

inline std::uint64_t seed_of(const std::string& uid) {
  return std::hash<std::string>{}(uid) % 100000;
}

inline ExpertServerConfig server_config() {
  ExpertServerConfig c;
  c.declare_period = 1s;
  c.declare_ttl = 2s;
  c.stop_timeout = 3s;
  return c;
}

// Waits (bounded) until `pred` holds; the stats it reads are bumped by the runtime thread.
template <class Pred>
bool wait_for(Pred pred, Duration limit = 10s) {
  const auto until = Clock::now() + limit;
  while (!pred()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(10ms);  // polling a counter, bounded by `limit`
  }
  return true;
}

// Runs `x` through `remote` and `local` and backpropagates `g` through both: outputs and input
// gradients must agree within 1e-5 (the local module's parameter gradients accumulate).
inline void expect_remote_matches_local(RemoteExpert& remote, ExpertModule& local,
                                        const torch::Tensor& x, const torch::Tensor& g) {
  auto xr = x.detach().clone().requires_grad_(true);
  auto xl = x.detach().clone().requires_grad_(true);
  auto y = remote.forward(xr);
  auto y_local = local.forward(xl);
  ASSERT_EQ(y.sizes(), y_local.sizes());
  EXPECT_TRUE(torch::allclose(y, y_local, 1e-5, 1e-5)) << (y - y_local).abs().max().item<float>();
  y.backward(g);
  y_local.backward(g);
  ASSERT_TRUE(xr.grad().defined());
  EXPECT_TRUE(torch::allclose(xr.grad(), xl.grad(), 1e-5, 1e-5))
      << (xr.grad() - xl.grad()).abs().max().item<float>();
}

// The parameters of `a` and `b` agree within 1e-5.
inline void expect_params_close(torch::nn::Module& a, torch::nn::Module& b,
                                const std::string& when) {
  auto pa = a.parameters();
  auto pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(torch::allclose(pa[i], pb[i], 1e-5, 1e-6)) << when << ": param " << i;
}

// A RemoteMixtureOfExperts over grid `ffn` of kDim-wide experts.
inline MoeOptions mixture_options(std::vector<std::int64_t> grid, std::size_t k, std::size_t k_min,
                                  Duration forward_timeout, Duration timeout_after_k_min) {
  MoeOptions o;
  o.grid_size = std::move(grid);
  o.in_features = kDim;
  o.out_features = kDim;
  o.k = k;
  o.k_min = k_min;
  o.forward_timeout = forward_timeout;
  o.timeout_after_k_min = timeout_after_k_min;
  return o;
}

struct Env {
  IoThread io{"moe-test-io"};
  std::unique_ptr<NodeCluster> cluster;
  ExpertServerConfig config = server_config();  // of the servers serve() starts

  Env() {
    cluster = std::make_unique<NodeCluster>(io.executor());
    auto r = block_on(
        io.executor(), [this] { return cluster->add_many(3); }, 60s);
    if (!r) throw std::runtime_error(r.error().message());
  }
  ~Env() {
    (void)block_on(
        io.executor(),
        [this]() -> awaitable<result<void>> {
          co_await cluster->stop_all();
          co_return success();
        },
        30s);
    (void)io.stop();
  }

  // A server on DHT node i's host, serving `pattern`.
  std::shared_ptr<ExpertServer> serve(std::size_t i, const std::string& pattern,
                                      Duration delay = Duration::zero(), std::int64_t dim = kDim,
                                      std::int64_t hidden = kHidden,
                                      OptimizerFactory opt = sgd_factory(kLr)) {
    auto dir = std::make_shared<averaging::DhtDirectory>(cluster->node_ptr(i));
    auto s = ExpertServer::create(cluster->host_ptr(i), dir, config);
    auto uids = expand_pattern(pattern);
    if (!uids) throw std::runtime_error(uids.error().message());
    for (const auto& u : uids.value()) {
      auto m = make_ffn_expert(dim, hidden, seed_of(u.to_string()));
      if (delay > Duration::zero())
        m.forward = [f = m.forward, delay](const torch::Tensor& x) {
          std::this_thread::sleep_for(delay);  // a slow expert (on the server's runtime thread)
          return f(x);
        };
      auto r = s->add_expert(u.to_string(), std::move(m), opt);
      if (!r) throw std::runtime_error(r.error().message());
    }
    start(s);
    return s;
  }
  // A server on DHT node i's host serving one expert, with config `c`; declared in the DHT
  // if `declare`.
  std::shared_ptr<ExpertServer> serve_module(std::size_t i, const std::string& uid, ExpertModule m,
                                             const ExpertServerConfig& c, bool declare) {
    std::shared_ptr<averaging::Directory> dir;
    if (declare) dir = std::make_shared<averaging::DhtDirectory>(cluster->node_ptr(i));
    auto s = ExpertServer::create(cluster->host_ptr(i), dir, c);
    auto r = s->add_expert(uid, std::move(m), sgd_factory(kLr));
    if (!r) throw std::runtime_error(r.error().message());
    start(s);
    return s;
  }
  void start(const std::shared_ptr<ExpertServer>& s) {
    auto st = block_on(
        io.executor(), [s] { return s->start(); }, 30s);
    if (!st) throw std::runtime_error(st.error().message());
  }
  void stop(const std::shared_ptr<ExpertServer>& s) {
    (void)block_on(
        io.executor(),
        [s]() -> awaitable<result<void>> {
          co_await s->stop();
          co_return success();
        },
        30s);
  }
  ExpertAddress address(std::size_t i, const std::string& uid) {
    return ExpertAddress{uid, cluster->host_ptr(i)->local_peer(),
                         cluster->host_ptr(i)->listen_addresses()};
  }
  std::shared_ptr<ExpertDirectory> directory(std::size_t i, Duration cache = 500ms) {
    return std::make_shared<ExpertDirectory>(
        std::make_shared<averaging::DhtDirectory>(cluster->node_ptr(i)), cache);
  }
  // The uids beam search finds for one all-zero-score sample.
  std::set<std::string> alive(const std::shared_ptr<ExpertDirectory>& d,
                              std::vector<std::int64_t> grid) {
    std::vector<std::vector<float>> s;
    std::size_t total = 1;
    for (auto g : grid) {
      s.emplace_back(static_cast<std::size_t>(g), 0.0f);
      total *= static_cast<std::size_t>(g);
    }
    auto scores = std::vector<std::vector<std::vector<float>>>{s};
    auto r = block_on(
        io.executor(), [&] { return d->beam_search("ffn", scores, total, 10s); }, 20s);
    std::set<std::string> out;
    if (!r) return out;
    for (const auto& e : r.value().at(0)) out.insert(e.uid);
    return out;
  }
};

}  // namespace starling::moe::test
