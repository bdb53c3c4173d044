// DhtDirectory: the averaging Directory on real DHT nodes over loopback. Entries written by
// different nodes are read back by a third; a node's newer value replaces its older one;
// already-expired entries are not published; and averagers find each other through the DHT
// (matchmaking) and end with the exact weighted mean.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dht/node_cluster.hpp"
#include "starling/averaging/averager.hpp"
#include "starling/averaging/dht_directory.hpp"
#include "starling/averaging/host_address_sink.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::averaging;
using starling::dht::test::NodeCluster;
using starling::dht::test::quick_config;

namespace {

std::vector<std::string> as_strings(const std::vector<Bytes>& v) {
  std::vector<std::string> out;
  for (const auto& b : v) out.emplace_back(b.begin(), b.end());
  std::sort(out.begin(), out.end());
  return out;
}

// Tells the host where group members listen (the averager's AddressSink).
struct Steps {
  std::vector<std::optional<result<StepResult>>> res;
  std::size_t done = 0;
  std::optional<AsyncEvent> all;
};

awaitable<void> step_one(std::shared_ptr<Averager> a, std::size_t i, Steps* st) {
  StepOptions so;
  so.weight = static_cast<double>(i + 1);
  so.timeout = 60s;
  so.matchmaking_timeout = 30s;
  st->res[i] = co_await a->step(so);
  if (++st->done == st->res.size()) st->all->set();
}

}  // namespace

TEST(DhtDirectory, EntriesFromSeveralNodesMergeAndReplace) {
  asio::io_context io;
  starling::test::run_with_deadline(
      io,
      [&]() -> awaitable<void> {
        NodeCluster c(io.get_executor());
        CO_ASSERT_OK(co_await c.add_many(4));
        DhtDirectory d0(c.node_ptr(0)), d1(c.node_ptr(1)), d3(c.node_ptr(3));
        const Bytes key = to_bytes("avg/test/group");
        const auto later = WallClock::now() + 60s;
        CO_ASSERT_OK(co_await d0.put(key, to_bytes("a"), to_bytes("from 0"), later));
        CO_ASSERT_OK(co_await d1.put(key, to_bytes("b"), to_bytes("from 1"), later));
        auto got = co_await d3.get(key);
        CO_ASSERT_OK(got);
        EXPECT_EQ(as_strings(got.value()), (std::vector<std::string>{"from 0", "from 1"}));
        // Node 0 rewrites its sub-key: the newer value replaces the old one.
        CO_ASSERT_OK(co_await d0.put(key, to_bytes("a"), to_bytes("from 0, newer"), later));
        got = co_await d3.get(key);
        CO_ASSERT_OK(got);
        EXPECT_EQ(as_strings(got.value()), (std::vector<std::string>{"from 0, newer", "from 1"}));
        // The same sub-key written by another node is another entry (sub-keys are signed and
        // owned by their writer, so node 1 cannot overwrite node 0's "a").
        CO_ASSERT_OK(co_await d1.put(key, to_bytes("a"), to_bytes("1 as a"), later));
        got = co_await d3.get(key);
        CO_ASSERT_OK(got);
        EXPECT_EQ(as_strings(got.value()),
                  (std::vector<std::string>{"1 as a", "from 0, newer", "from 1"}));
        // An entry that has already expired is not published.
        CO_ASSERT_OK(co_await d0.put(to_bytes("avg/expired"), to_bytes("x"), to_bytes("old"),
                                     WallClock::now() - 1s));
        auto none = co_await d3.get(to_bytes("avg/expired"));
        CO_ASSERT_OK(none);
        EXPECT_TRUE(none.value().empty());
        co_await c.stop_all();
      },
      120s);
}

TEST(DhtDirectory, AveragersMatchmakeThroughTheDht) {
  constexpr std::size_t kPeers = 3;
  asio::io_context io;
  starling::test::run_with_deadline(
      io,
      [&]() -> awaitable<void> {
        NodeCluster c(io.get_executor());
        CO_ASSERT_OK(co_await c.add_many(kPeers));
        Schema schema{{{"w", {1000}, DType::f32}, {"b", {7}, DType::f32}}, "none"};
        std::vector<std::vector<float>> w(kPeers, std::vector<float>(1000)),
            b(kPeers, std::vector<float>(7));
        std::vector<std::shared_ptr<Averager>> avg;
        for (std::size_t i = 0; i < kPeers; ++i) {
          for (std::size_t e = 0; e < w[i].size(); ++e)
            w[i][e] = std::sin(static_cast<float>(e * (i + 1)));
          for (std::size_t e = 0; e < b[i].size(); ++e) b[i][e] = static_cast<float>(i * 10 + e);
          AveragerConfig cfg;
          cfg.key = {"dhtdir", 16, 0};
          cfg.matchmaking.min_wait = 1s;
          cfg.matchmaking.settle = 300ms;
          cfg.matchmaking.refresh_interval = 300ms;
          cfg.open_timeout = 30s;
          cfg.seed = i + 1;
          net::Host& host = c.node(i).host();
          for (const auto& a : host.listen_addresses()) cfg.addrs.push_back(a.to_string());
          std::vector<TensorView> views{{"w", w[i]}, {"b", b[i]}};
          auto dir = std::make_shared<DhtDirectory>(c.node_ptr(i));
          std::shared_ptr<net::Host> hp(c.node_ptr(i), &host);  // aliasing: owned by the node
          auto a = Averager::create(hp, dir, schema, views, cfg, host_address_sink(hp));
          CO_ASSERT_OK(a);
          a.value()->start();
          avg.push_back(a.value());
        }
        const auto w0 = w, b0 = b;
        Steps st;
        st.res.resize(kPeers);
        st.all.emplace(io.get_executor());
        for (std::size_t i = 0; i < kPeers; ++i)
          asio::co_spawn(io, step_one(avg[i], i, &st), asio::detached);
        (void)co_await st.all->wait();
        for (std::size_t i = 0; i < kPeers; ++i) {
          const auto& r = *st.res[i];
          if (!r) ADD_FAILURE() << "peer " << i << ": " << r.error().message();
          CO_ASSERT_TRUE(r.has_value());
          EXPECT_EQ(r.value().group.members.size(), kPeers) << "peer " << i;
        }
        const double wsum = 1 + 2 + 3;
        for (std::size_t e = 0; e < 1000; ++e) {
          double want = 0;
          for (std::size_t j = 0; j < kPeers; ++j) want += (j + 1) / wsum * w0[j][e];
          EXPECT_NEAR(w[0][e], want, 2e-5 * (1 + std::abs(want))) << "element " << e;
          if (std::abs(w[0][e] - want) > 1e-3) break;
        }
        for (std::size_t i = 1; i < kPeers; ++i) {
          EXPECT_EQ(std::memcmp(w[i].data(), w[0].data(), w[0].size() * sizeof(float)), 0);
          EXPECT_EQ(std::memcmp(b[i].data(), b[0].data(), b[0].size() * sizeof(float)), 0);
        }
        for (auto& a : avg) co_await a->stop();
        co_await c.stop_all();
      },
      150s);
}
