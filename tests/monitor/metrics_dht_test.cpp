// Metrics records through a real DHT over loopback (port 0): publishers, a reader, a forgery
// and expiry.
#include <gtest/gtest.h>

#include "dht/node_cluster.hpp"
#include "starling/monitor/metrics_dht.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::monitor;
using starling::dht::test::NodeCluster;
using starling::dht::test::quick_config;

namespace {

MetricsRecord record(std::string name, std::uint64_t epoch) {
  MetricsRecord r;
  r.name = std::move(name);
  r.version = software_version();
  r.epoch = epoch;
  r.samples_per_second = 10;
  return r;
}

// Reads until `done(entries)` holds or `deadline` passes; the last read.
awaitable<std::vector<MetricsEntry>> read_until(
    std::shared_ptr<dht::DhtNode> node, std::string run,
    std::function<bool(const std::vector<MetricsEntry>&)> done, Duration deadline) {
  const auto until = Clock::now() + deadline;
  std::vector<MetricsEntry> last;
  for (;;) {
    auto r = co_await read_metrics(node, metrics_key(run));
    if (r) last = std::move(r).value();
    if ((r && done(last)) || Clock::now() > until) co_return last;
    (void)co_await sleep_for(100ms);
  }
}

awaitable<void> cluster_main(std::function<awaitable<void>(NodeCluster&)> body) {
  NodeCluster c(co_await asio::this_coro::executor);
  co_await body(c);
  co_await c.stop_all();
}
void run_cluster_test(std::function<awaitable<void>(NodeCluster&)> body) {
  asio::io_context io;
  starling::test::run_with_deadline(io, cluster_main(std::move(body)), 120s);
}

}  // namespace

TEST(MonitorDht, PublishedRecordsAreReadForgeriesRefusedAndRecordsExpire) {
  run_cluster_test([](NodeCluster& c) -> awaitable<void> {
    CO_ASSERT_OK(co_await c.add_many(5));
    PublisherConfig pc;
    pc.run_id = "run-a";
    pc.interval = 200ms;
    pc.ttl = 3s;
    auto pub1 = MetricsPublisher::create(c.node_ptr(1), pc);
    auto pub2 = MetricsPublisher::create(c.node_ptr(2), pc);
    pub1->submit(record("one", 1));
    pub2->submit(record("two", 1));
    const auto reader = c.node_ptr(4);
    auto both = co_await read_until(
        reader, "run-a", [](const auto& v) { return v.size() == 2; }, 20s);
    CO_ASSERT_TRUE(both.size() == 2u);
    for (const auto& e : both) {
      auto rec = decode_metrics(e.value);
      CO_ASSERT_OK(rec);
      EXPECT_EQ(rec.value().name, e.peer == c.node(1).peer() ? "one" : "two");
      EXPECT_EQ(rec.value().ttl_ms, 3000u);
    }
    // A newer record replaces the older one (seq advances).
    pub1->submit(record("one", 2));
    auto newer = co_await read_until(
        reader, "run-a",
        [&](const auto& v) {
          for (const auto& e : v)
            if (e.peer == c.node(1).peer() && decode_metrics(e.value).value().epoch == 2)
              return true;
          return false;
        },
        20s);
    bool saw = false;
    for (const auto& e : newer)
      if (e.peer == c.node(1).peer()) saw = decode_metrics(e.value).value().seq >= 1;
    EXPECT_TRUE(saw);
    // Node 3 cannot write node 1's record: neither unsigned nor signed with its own key.
    const auto key = metrics_key("run-a");
    const auto sub = metrics_subkey(c.node(1).peer());
    auto forged_value = encode_metrics(record("forged", 99)).value();
    auto forged = co_await c.node(3).store(key, sub, forged_value, dht::Millis(60'000));
    EXPECT_FALSE(forged);
    std::optional<dht::SubKey> sub_opt = sub;
    auto forged2 = co_await c.node(3).store_signed(key, sub_opt, forged_value, dht::Millis(60'000));
    EXPECT_FALSE(forged2);
    auto after = co_await read_metrics(reader, key);
    CO_ASSERT_OK(after);
    for (const auto& e : after.value()) EXPECT_NE(decode_metrics(e.value).value().name, "forged");
    // Stopped publishers' records expire (ttl 3 s).
    co_await pub1->stop();
    co_await pub2->stop();
    auto gone = co_await read_until(
        reader, "run-a", [](const auto& v) { return v.empty(); }, 20s);
    EXPECT_TRUE(gone.empty());
    EXPECT_GE(pub1->published(), 2u);
    EXPECT_EQ(pub1->failed(), 0u);
  });
}

TEST(MonitorDht, PollerFeedsEveryRead) {
  run_cluster_test([](NodeCluster& c) -> awaitable<void> {
    CO_ASSERT_OK(co_await c.add_many(3));
    PublisherConfig pc;
    pc.run_id = "run-b";
    pc.interval = 100ms;
    auto pub = MetricsPublisher::create(c.node_ptr(0), pc);
    pub->submit(record("p", 3));
    PollerConfig poll;
    poll.run_id = "run-b";
    poll.interval = 100ms;
    auto reads = std::make_shared<std::vector<std::size_t>>();
    auto done = std::make_shared<AsyncEvent>(co_await asio::this_coro::executor);
    TaskScope scope(co_await asio::this_coro::executor);
    scope.spawn(poll_metrics(c.node_ptr(2), poll, [reads, done](std::vector<MetricsEntry> v) {
      reads->push_back(v.size());
      if (v.size() == 1) done->set();
    }));
    auto waited = co_await with_timeout(done->wait(), 20s, "poller");
    EXPECT_TRUE(waited);
    (void)co_await scope.close(5s);
    co_await pub->stop();
    EXPECT_FALSE(reads->empty());
  });
}
