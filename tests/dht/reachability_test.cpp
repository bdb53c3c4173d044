// DhtNode::set_reachable: a server-configured node that AutoNAT finds unreachable runs in client
// mode (peers drop it from their routing tables, it announces nothing) and becomes a server
// again once reachable.
#include <gtest/gtest.h>

#include "node_cluster.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::dht;
using starling::dht::test::NodeCluster;
using starling::dht::test::quick_config;

namespace {
awaitable<void> body(NodeCluster& c) {
  CO_ASSERT_OK(co_await c.add_many(6));
  const std::size_t n = 5;  // the node that turns out to be private
  DhtNode& node = c.node(n);
  const auto id = node.core().id();
  auto holders = [&] {
    std::size_t k = 0;
    for (std::size_t i = 0; i < c.size(); ++i)
      if (i != n && c.node(i).core().routing().contains(id)) ++k;
    return k;
  };
  CO_ASSERT_TRUE(holders() > 0);
  EXPECT_FALSE(node.announced().empty());

  node.set_reachable(false);
  EXPECT_TRUE(node.client_mode());
  EXPECT_TRUE(node.announced().empty());
  // Its next requests (a lookup asks every node it meets) carry client mode: peers drop it.
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (i == n) continue;
    auto f = co_await node.find_node(c.node(i).core().id());
    CO_ASSERT_OK(f);
  }
  EXPECT_EQ(holders(), 0u);
  // Still able to use the DHT as a client.
  auto s = co_await node.store(RecordKey::from_string("k"), to_bytes("v"), Millis(60'000));
  CO_ASSERT_OK(s);
  EXPECT_EQ(node.core().records().key_count(), 0u);  // never a replica in client mode

  node.set_reachable(true);
  EXPECT_FALSE(node.client_mode());
  EXPECT_FALSE(node.announced().empty());
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (i == n) continue;
    auto f = co_await node.find_node(c.node(i).core().id());
    CO_ASSERT_OK(f);
  }
  EXPECT_GT(holders(), 0u);

  // A node configured in client mode stays one.
  CO_ASSERT_OK(co_await c.add(quick_config(/*client=*/true)));
  c.node(c.size() - 1).set_reachable(true);
  EXPECT_TRUE(c.node(c.size() - 1).client_mode());
}

awaitable<void> cluster_main() {
  NodeCluster c(co_await asio::this_coro::executor);
  co_await body(c);
  co_await c.stop_all();
}
}  // namespace

TEST(DhtReachability, UnreachableServerRunsInClientMode) {
  asio::io_context io;
  starling::test::run_with_deadline(io, cluster_main(), 60s);
}
