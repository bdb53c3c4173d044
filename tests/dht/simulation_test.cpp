// Deterministic many-node simulation of the DHT protocol core (virtual time, 5-40 ms message
// latency, 1% of messages lost): lookup hops against network size, every node finding every
// stored key, and gets after a random 30% of the nodes disappear.
// STARLING_SIM_NODES=<n> runs them with n instead of 1000 nodes (for slow sanitizer builds).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <numeric>

#include "sim_network.hpp"

using namespace starling;
using namespace starling::dht;
using namespace starling::dht::test;

namespace {
double cpu_seconds() {
  return static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
}

SimOptions sim_options(std::uint64_t seed) {
  SimOptions o;
  o.seed = seed;
  o.drop_rate = 0.01;
  return o;  // DhtConfig defaults: k = 20, alpha = 3, 8 replicas, relaxed splits (b = 5)
}

std::vector<RecordKey> store_keys(SimNetwork& net, std::size_t n, const std::string& prefix) {
  std::vector<RecordKey> keys;
  for (std::size_t i = 0; i < n; ++i) {
    keys.push_back(RecordKey::from_string(prefix + std::to_string(i)));
    std::size_t writer;
    do {
      writer = std::uniform_int_distribution<std::size_t>(0, net.size() - 1)(net.rng());
    } while (!net.alive(writer));
    std::vector<Record> recs{Record{std::nullopt,
                                    RecordBody{to_bytes("value " + std::to_string(i)), 1, {}, {}},
                                    std::chrono::hours(2)}};
    auto r = net.run_op(
        writer, [&](DhtCore& c, const Now& now) { return c.store(keys.back(), recs, {}, now); });
    EXPECT_TRUE(r.status) << r.status.error().message();
  }
  return keys;
}

bool holds(SimNetwork& net, std::size_t node, const RecordKey& key) {
  return !net.core(node).records().records(key.id(), net.time()).empty();
}

struct GetStats {
  std::size_t ok = 0, total = 0;
  std::vector<double> hops;
  double mean_hops() const {
    return hops.empty()
               ? 0
               : std::accumulate(hops.begin(), hops.end(), 0.0) / static_cast<double>(hops.size());
  }
};

GetStats get_one(SimNetwork& net, std::size_t node, const RecordKey& key, GetStats& s) {
  auto r = net.run_op(node, [&](DhtCore& c, const Now& now) { return c.get(key, {}, now); });
  ++s.total;
  if (r.status && r.value.plain()) {
    ++s.ok;
    if (r.stats.hops > 0) s.hops.push_back(static_cast<double>(r.stats.hops));
  }
  return s;
}
}  // namespace

TEST(DhtSimulation, LookupHopsGrowLikeLogN) {
  // Textbook Kademlia parameters (k = 20, only the bucket covering our id splits), so that
  // routing tables stay much smaller than the network and hops are visible at these sizes.
  // (With the default relaxed splitting, tables of 1000-node networks hold most nodes and a
  // get takes about one hop: see EveryNodeFindsEveryStoredKey.)
  const std::size_t n = sim_nodes(1000);
  auto o = sim_options(11);
  o.config.split_depth_modulo = 0;
  SimNetwork net(o);
  std::vector<std::pair<std::size_t, double>> table;  // size, mean hops
  for (std::size_t size : {n / 8, n / 4, n / 2, n}) {
    net.grow(size - net.size());
    net.run_for(1min);
    auto keys = store_keys(net, 10, "hops/" + std::to_string(size) + "/");
    GetStats s;
    while (s.total < 300) {
      const auto node = std::uniform_int_distribution<std::size_t>(0, net.size() - 1)(net.rng());
      const auto& key = keys[s.total % keys.size()];
      if (holds(net, node, key)) continue;  // a local hit takes no hop
      get_one(net, node, key, s);
    }
    EXPECT_EQ(s.ok, s.total) << "at " << size << " nodes";
    table.emplace_back(size, s.mean_hops());
    std::printf("  %5zu nodes: mean lookup hops %.2f over %zu gets (%llu messages so far)\n", size,
                s.mean_hops(), s.total, static_cast<unsigned long long>(net.messages()));
  }
  // Least-squares slope of mean hops against log2(N): at most ~1 hop per doubling (each hop
  // at least halves the distance), so log-like; and going from N/8 to N (3 doublings) adds
  // at most 3 hops. A linear walk would add ~N/8 hops.
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [size, hops] : table) {
    const double x = std::log2(static_cast<double>(size));
    sx += x, sy += hops, sxx += x * x, sxy += x * hops;
  }
  const double m = static_cast<double>(table.size());
  const double slope = (m * sxy - sx * sy) / (m * sxx - sx * sx);
  std::printf("  slope %.3f hops per doubling of N\n", slope);
  EXPECT_LE(slope, 1.0);
  EXPECT_LE(table.back().second - table.front().second, 1.0 * std::log2(8.0));
  for (const auto& [size, hops] : table) {
    EXPECT_GE(hops, 1.0);
    EXPECT_LE(hops, std::log2(static_cast<double>(size)));
  }
}

TEST(DhtSimulation, EveryNodeFindsEveryStoredKey) {
  const std::size_t n = sim_nodes(1000);
  SimNetwork net(sim_options(12));
  net.grow(n);
  net.run_for(1min);
  std::printf("  %zu nodes joined (%.1f s cpu)\n", n, cpu_seconds());
  auto keys = store_keys(net, 10, "every/");
  GetStats s;
  for (std::size_t node = 0; node < net.size(); ++node)
    for (const auto& key : keys) get_one(net, node, key, s);
  std::printf("  %zu/%zu gets succeeded, mean hops %.2f, %llu messages (%llu lost) (%.1f s cpu)\n",
              s.ok, s.total, s.mean_hops(), static_cast<unsigned long long>(net.messages()),
              static_cast<unsigned long long>(net.dropped()), cpu_seconds());
  EXPECT_EQ(s.ok, s.total);
}

TEST(DhtSimulation, GetsSurviveLosingThirtyPercentOfNodes) {
  const std::size_t n = sim_nodes(1000);
  SimNetwork net(sim_options(13));
  net.grow(n);
  net.run_for(1min);
  std::printf("  %zu nodes joined (%.1f s cpu)\n", n, cpu_seconds());
  auto keys = store_keys(net, 50, "churn/");
  // Remove a random 30% (writers included), with no warning to anyone.
  std::vector<std::size_t> order(net.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), net.rng());
  for (std::size_t i = 0; i < net.size() * 3 / 10; ++i) net.kill(order[i]);
  auto round = [&](const char* when) {
    GetStats s;
    while (s.total < 1000) {
      const auto node = std::uniform_int_distribution<std::size_t>(0, net.size() - 1)(net.rng());
      if (!net.alive(node)) continue;
      get_one(net, node, keys[s.total % keys.size()], s);
    }
    std::printf("  %s: %zu/%zu gets succeeded (%.2f%%), mean hops %.2f (%.1f s cpu)\n", when, s.ok,
                s.total, 100.0 * static_cast<double>(s.ok) / static_cast<double>(s.total),
                s.mean_hops(), cpu_seconds());
    return s;
  };
  auto right_after = round("right after removing 30%");
  EXPECT_GE(right_after.ok * 100, right_after.total * 99);
  net.run_for(6min);  // owners republish their records to the new closest nodes
  auto later = round("6 minutes later");
  EXPECT_GE(later.ok * 100, later.total * 99);
}

namespace {
// Virtual milliseconds of `count` stores (random writers and keys) and of a get of each key
// from another random node: (store median, get median).
std::pair<double, double> store_get_latency(SimNetwork& net, std::size_t count,
                                            const std::string& prefix) {
  std::vector<double> stores, gets;
  auto pick = [&] {
    return std::uniform_int_distribution<std::size_t>(0, net.size() - 1)(net.rng());
  };
  auto ms_since = [&](TimePoint t0) {
    return std::chrono::duration<double, std::milli>(net.time() - t0).count();
  };
  for (std::size_t i = 0; i < count; ++i) {
    const auto key = RecordKey::from_string(prefix + std::to_string(i));
    std::vector<Record> recs{
        Record{std::nullopt, RecordBody{to_bytes("v"), 1, {}, {}}, std::chrono::hours(1)}};
    auto t0 = net.time();
    auto s =
        net.run_op(pick(), [&](DhtCore& c, const Now& now) { return c.store(key, recs, {}, now); });
    EXPECT_TRUE(s.status);
    stores.push_back(ms_since(t0));
    net.run_for(1s);  // the background replica requests land
    t0 = net.time();
    auto g = net.run_op(pick(), [&](DhtCore& c, const Now& now) { return c.get(key, {}, now); });
    EXPECT_TRUE(g.status && g.value.plain());
    gets.push_back(ms_since(t0));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(stores), median(gets)};
}
}  // namespace

TEST(DhtSimulation, StoresTakeFewRoundTrips) {
  // The store path against the classic one (a lookup of the k closest, alpha = 3, then the
  // store round, waiting for every replica), same network, same keys: a narrower store beam
  // asked at once, records sent to the closest as they answer, and a quorum of replicas.
  const std::size_t n = sim_nodes(500);
  auto measure = [n](const DhtConfig& cfg) {
    auto o = sim_options(14);  // the same network both times (store settings do not change joins)
    o.config = cfg;
    SimNetwork net(o);
    net.grow(n);
    net.run_for(1min);
    return store_get_latency(net, 40, "stores/");
  };
  const auto [store_ms, get_ms] = measure(DhtConfig{});
  DhtConfig classic;
  classic.store_beam_width = classic.k;
  classic.store_alpha = classic.alpha;
  classic.store_quorum = classic.replicas;
  classic.store_early = false;
  const auto [classic_store_ms, classic_get_ms] = measure(classic);
  std::printf(
      "  %zu nodes, 5-40 ms per message: store median %.0f ms (classic %.0f ms), get "
      "median %.0f ms (%.0f ms)\n",
      n, store_ms, classic_store_ms, get_ms, classic_get_ms);
  EXPECT_LT(store_ms, 0.6 * classic_store_ms);
  EXPECT_LT(store_ms, 3 * 2 * 40.0);  // at most three round trips of the slowest link
}
