// DhtNode over real loopback sockets: many nodes in one process (port 0), each on its own
// libp2p host, all on one io_context.
#include <gtest/gtest.h>

#include <google/protobuf/wrappers.pb.h>

#include "node_cluster.hpp"
#include "starling/core/log.hpp"
#include "starling/dht/channel.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::dht;
using starling::dht::test::NodeCluster;
using starling::dht::test::quick_config;

namespace {

constexpr Duration kTestDeadline = 120s;

std::string key_name(std::size_t i) {
  return "key-" + std::to_string(i);
}
Bytes value_of(std::size_t i) {
  return to_bytes("value-" + std::to_string(i));
}

// Counts outcomes of concurrent operations.
struct Tally {
  std::size_t ok = 0, wrong = 0, failed = 0;
  std::string first_error;
  void fail(const std::string& why) {
    ++failed;
    if (first_error.empty()) first_error = why;
  }
};

awaitable<void> get_expect_plain(std::shared_ptr<DhtNode> n, RecordKey key, Bytes want, Tally* t) {
  auto r = co_await n->get(key);
  if (!r) {
    t->fail(r.error().message());
    co_return;
  }
  if (!r.value() || !r.value()->plain) {
    t->fail("not found: " + key.to_string());
    co_return;
  }
  if (r.value()->plain->value == want)
    ++t->ok;
  else
    ++t->wrong;
}

awaitable<void> get_count_subkeys(std::shared_ptr<DhtNode> n, RecordKey key, std::size_t want,
                                  Tally* t) {
  auto r = co_await n->get(key, /*latest=*/true);
  if (!r) {
    t->fail(r.error().message());
    co_return;
  }
  if (!r.value()) {
    t->fail("not found: " + key.to_string());
    co_return;
  }
  if (r.value()->dictionary.size() == want)
    ++t->ok;
  else
    ++t->wrong;
}

// A get that may fail (its node may be stopped meanwhile) but must end.
awaitable<void> get_any(std::shared_ptr<DhtNode> n, RecordKey key, Bytes want, Tally* t) {
  auto r = co_await n->get(key);
  if (r && r.value() && r.value()->plain && r.value()->plain->value == want)
    ++t->ok;
  else if (r && r.value())
    ++t->wrong;
  else
    t->fail(r ? "not found" : r.error().message());
}

awaitable<void> stop_node(NodeCluster* c, std::size_t i) {
  co_await c->stop(i);
}

// Runs `body` on a fresh cluster (stopped afterwards, also when an assertion ends the body).
awaitable<void> cluster_main(std::function<awaitable<void>(NodeCluster&)> body) {
  NodeCluster c(co_await asio::this_coro::executor);
  co_await body(c);
  co_await c.stop_all();
}
void run_cluster_test(std::function<awaitable<void>(NodeCluster&)> body) {
  asio::io_context io;
  starling::test::run_with_deadline(io, cluster_main(std::move(body)), kTestDeadline);
}

}  // namespace

TEST(DhtNode, FiftyNodesEveryNodeGetsEveryKey) {
  run_cluster_test([](NodeCluster& c) -> awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    CO_ASSERT_OK(co_await c.add_many(50));
    for (std::size_t i = 0; i < 50; ++i) EXPECT_GT(c.node(i).core().routing().size(), 0u);
    constexpr std::size_t kKeys = 10;
    for (std::size_t k = 0; k < kKeys; ++k) {
      auto s = co_await c.node((k * 7) % 50)
                   .store(RecordKey::from_string(key_name(k)), value_of(k), Millis(60'000));
      CO_ASSERT_OK(s);
      EXPECT_GE(s.value().replicas, 4u);
    }
    Tally t;
    for (std::size_t k = 0; k < kKeys; ++k) {
      TaskScope scope(ex);
      for (std::size_t i = 0; i < 50; ++i)
        scope.spawn(
            get_expect_plain(c.node_ptr(i), RecordKey::from_string(key_name(k)), value_of(k), &t));
      CO_ASSERT_OK(co_await scope.join(60s));
    }
    EXPECT_EQ(t.ok, 50 * kKeys) << "wrong " << t.wrong << ", failed " << t.failed << ": "
                                << t.first_error;
    // No node saw a malformed message.
    for (std::size_t i = 0; i < 50; ++i) EXPECT_EQ(c.node(i).bad_messages(), 0u);
  });
}

TEST(DhtNode, DictionaryMergesAcrossWriters) {
  run_cluster_test([](NodeCluster& c) -> awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    CO_ASSERT_OK(co_await c.add_many(16));
    const auto key = RecordKey::from_string("group/alpha");
    // Ten writers, one sub-key each; then writer 0 overwrites its sub-key.
    for (std::size_t i = 0; i < 10; ++i) {
      auto s = co_await c.node(i).store(key, SubKey::from_string("peer-" + std::to_string(i)),
                                        value_of(i), Millis(60'000));
      CO_ASSERT_OK(s);
    }
    const auto overwritten_at = Clock::now();
    auto over = co_await c.node(0).store(key, SubKey::from_string("peer-0"), to_bytes("newer"),
                                         Millis(60'000));
    CO_ASSERT_OK(over);
    Tally t;
    {
      TaskScope scope(ex);
      for (std::size_t i = 0; i < 16; ++i)
        scope.spawn(get_count_subkeys(c.node_ptr(i), key, 10, &t));
      CO_ASSERT_OK(co_await scope.join(60s));
    }
    EXPECT_EQ(t.ok, 16u) << "wrong " << t.wrong << ", failed " << t.failed << ": " << t.first_error;
    // A plain get (early finish, quorum merge) from a node that wrote nothing.
    auto got = co_await c.node(15).get(key);
    CO_ASSERT_OK(got);
    CO_ASSERT_TRUE(got.value().has_value());
    const Found& f = *got.value();
    EXPECT_TRUE(f.is_dictionary());
    EXPECT_FALSE(f.plain.has_value());
    auto p0 = f.dictionary.find(SubKey::from_string("peer-0"));
    CO_ASSERT_TRUE(p0 != f.dictionary.end());
    EXPECT_EQ(p0->second.value, to_bytes("newer"));
    // The TTL left is 60 s minus the time since the overwrite (bounded by the measured time,
    // not a fixed window, so a slow machine cannot fail it), with 1 s for rounding.
    const auto since = std::chrono::duration_cast<Millis>(Clock::now() - overwritten_at);
    EXPECT_GE(p0->second.ttl.count(), 60'000 - since.count() - 1'000);
    EXPECT_LE(p0->second.ttl.count(), 60'000);
    // A key nobody stored: found nowhere, reported as absent (not as an error).
    auto none = co_await c.node(4).get(RecordKey::from_string("absent"));
    CO_ASSERT_OK(none);
    EXPECT_FALSE(none.value().has_value());
  });
}

TEST(DhtNode, SignedRecordsAndForgeries) {
  run_cluster_test([](NodeCluster& c) -> awaitable<void> {
    CO_ASSERT_OK(co_await c.add_many(12));
    DhtNode& owner = c.node(3);
    DhtNode& other = c.node(7);
    // An owned sub-key in a shared dictionary, and an owned key.
    const auto shared = RecordKey::from_string("experts");
    const SubKey mine = owner.owned_subkey("expert.0");
    CO_ASSERT_OK(co_await owner.store_signed(shared, mine, to_bytes("owner's"), Millis(60'000)));
    const RecordKey owned = owner.owned_key("progress");
    CO_ASSERT_OK(
        co_await owner.store_signed(owned, std::nullopt, to_bytes("step 7"), Millis(60'000)));
    // Another node cannot write them: unsigned, or signed with its own key.
    auto forged = co_await other.store(shared, mine, to_bytes("forged"), Millis(60'000));
    EXPECT_FALSE(forged);
    auto forged2 = co_await other.store_signed(shared, mine, to_bytes("forged"), Millis(60'000));
    EXPECT_FALSE(forged2);
    auto forged3 = co_await other.store(owned, to_bytes("forged"), Millis(60'000));
    EXPECT_FALSE(forged3);
    // Everyone sees the owner's values, marked signed.
    for (std::size_t i = 0; i < c.size(); ++i) {
      auto d = co_await c.node(i).get(shared, true);
      CO_ASSERT_OK(d);
      CO_ASSERT_TRUE(d.value().has_value());
      auto it = d.value()->dictionary.find(mine);
      CO_ASSERT_TRUE(it != d.value()->dictionary.end());
      EXPECT_EQ(it->second.value, to_bytes("owner's"));
      EXPECT_TRUE(it->second.is_signed);
      auto p = co_await c.node(i).get(owned);
      CO_ASSERT_OK(p);
      CO_ASSERT_TRUE(p.value().has_value() && p.value()->plain.has_value());
      EXPECT_EQ(p.value()->plain->value, to_bytes("step 7"));
    }
  });
}

TEST(DhtNode, ClientModeNeverEntersRoutingTables) {
  run_cluster_test([](NodeCluster& c) -> awaitable<void> {
    CO_ASSERT_OK(co_await c.add_many(10));
    std::vector<std::size_t> clients;
    for (std::size_t i = 0; i < 3; ++i) {
      CO_ASSERT_OK(co_await c.add(quick_config(/*client=*/true)));
      clients.push_back(c.size() - 1);
    }
    for (std::size_t k = 0; k < 3; ++k) {
      DhtNode& cl = c.node(clients[k]);
      EXPECT_TRUE(cl.client_mode());
      EXPECT_TRUE(cl.announced().empty());
      EXPECT_GT(cl.core().routing().size(), 0u);  // clients do route
      auto s = co_await cl.store(RecordKey::from_string(key_name(k)), value_of(k), Millis(60'000));
      CO_ASSERT_OK(s);
      EXPECT_GE(s.value().replicas, 1u);
      EXPECT_EQ(cl.core().records().key_count(), 0u);  // never a replica
      // Another client reads it.
      auto g = co_await c.node(clients[(k + 1) % 3]).get(RecordKey::from_string(key_name(k)));
      CO_ASSERT_OK(g);
      CO_ASSERT_TRUE(g.value().has_value() && g.value()->plain.has_value());
      EXPECT_EQ(g.value()->plain->value, value_of(k));
    }
    for (std::size_t i = 0; i < c.size(); ++i)
      for (auto cl : clients)
        EXPECT_FALSE(c.node(i).core().routing().contains(c.node(cl).core().id()))
            << "node " << i << " has client " << cl << " in its routing table";
    // Clients do not serve the protocol.
    for (auto cl : clients) {
      auto protos = c.node(cl).host().protocols();
      EXPECT_EQ(std::find(protos.begin(), protos.end(), kDhtProtocol), protos.end());
      EXPECT_EQ(std::find(protos.begin(), protos.end(), kDhtChannelProtocol), protos.end());
    }
  });
}

TEST(DhtNode, StoppingNodesMidLookupDoesNotHangOthers) {
  run_cluster_test([](NodeCluster& c) -> awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    CO_ASSERT_OK(co_await c.add_many(20));
    constexpr std::size_t kKeys = 5;
    for (std::size_t k = 0; k < kKeys; ++k)
      CO_ASSERT_OK(co_await c.node(19 - k).store(RecordKey::from_string(key_name(k)), value_of(k),
                                                 Millis(60'000)));
    Tally survivors, stopping;
    TaskScope scope(ex);
    // Gets from nodes 6..19 (they stay) and from 1..5 (stopped while their gets run).
    for (std::size_t k = 0; k < kKeys; ++k)
      for (std::size_t i = 1; i < 20; ++i)
        scope.spawn(get_any(c.node_ptr(i), RecordKey::from_string(key_name(k)), value_of(k),
                            i <= 5 ? &stopping : &survivors));
    for (std::size_t i = 1; i <= 5; ++i) scope.spawn(stop_node(&c, i));
    const auto t0 = Clock::now();
    CO_ASSERT_OK(co_await scope.join(60s));
    EXPECT_LT(Clock::now() - t0, 40s);
    EXPECT_EQ(survivors.ok, 14 * kKeys) << "wrong " << survivors.wrong << ", failed "
                                        << survivors.failed << ": " << survivors.first_error;
    EXPECT_EQ(stopping.ok + stopping.wrong + stopping.failed, 5 * kKeys);
    EXPECT_EQ(stopping.wrong + survivors.wrong, 0u);
    for (std::size_t i = 1; i <= 5; ++i) EXPECT_TRUE(c.stopped(i));
  });
}

TEST(DhtNode, BootstrapFailsClearlyWhenNoPeerAnswers) {
  asio::io_context io;
  starling::test::run_with_deadline(
      io,
      [&]() -> awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        // A peer that is gone: start a host, note its address, stop it.
        auto gone = net::Host::create(ex, crypto::KeyPair::generate());
        CO_ASSERT_OK(co_await gone->start());
        const auto addr = gone->listen_addresses().at(0);
        co_await gone->stop();
        auto host = net::Host::create(ex, crypto::KeyPair::generate());
        CO_ASSERT_OK(co_await host->start());
        auto cfg = quick_config();
        cfg.bootstrap_attempts = 2;
        cfg.dht.request_timeout = 2s;
        auto node = DhtNode::create(host, cfg);
        std::vector<net::Multiaddr> seeds{addr};
        auto r = co_await node->start(seeds);
        CO_ASSERT_FALSE(r);
        EXPECT_EQ(r.error(), errc::unavailable);
        EXPECT_NE(r.error().message().find("none of the 1 initial peers answered"),
                  std::string::npos)
            << r.error().message();
        // No peers at all is a caller error.
        auto none = co_await node->bootstrap({});
        EXPECT_EQ(none.error(), errc::invalid_argument);
        co_await node->stop();
        co_await host->stop();
      },
      kTestDeadline);
}

// Two processes started with one identity file: the second's only initial peer has its own
// peer id. That fails at once with a message that says so (retrying cannot help).
TEST(DhtNode, AnInitialPeerWithOurOwnIdIsAClearErrorWithoutRetries) {
  asio::io_context io;
  starling::test::run_with_deadline(
      io,
      [&]() -> awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        const auto key = crypto::KeyPair::generate();
        auto first = net::Host::create(ex, key);
        CO_ASSERT_OK(co_await first->start());
        const auto addr = first->listen_addresses().at(0).with_peer_id(first->local_peer());
        auto host = net::Host::create(ex, key);
        CO_ASSERT_OK(co_await host->start());
        auto cfg = quick_config();
        cfg.bootstrap_attempts = 4;
        cfg.bootstrap_backoff = 5s;  // a retry would push this test past its deadline check
        auto node = DhtNode::create(host, cfg);
        const auto t0 = Clock::now();
        std::vector<net::Multiaddr> seeds{addr};
        auto r = co_await node->start(seeds);
        CO_ASSERT_FALSE(r);
        EXPECT_EQ(r.error(), errc::invalid_argument);
        EXPECT_NE(r.error().message().find("own peer id"), std::string::npos)
            << r.error().message();
        EXPECT_LT(Clock::now() - t0, 4s);
        co_await node->stop();
        co_await host->stop();
        co_await first->stop();
      },
      kTestDeadline);
}

TEST(DhtNode, BadRequestClosesTheStreamWithAReason) {
  run_cluster_test([](NodeCluster& c) -> awaitable<void> {
    CO_ASSERT_OK(co_await c.add_many(2));
    net::RpcClient client(c.node(1).host());
    google::protobuf::BytesValue junk;
    junk.set_value(std::string("\x0a\xff\xff\xff\xff\x0f garbage", 14));
    auto r = co_await client.unary<google::protobuf::BytesValue, google::protobuf::BytesValue>(
        c.node(0).peer(), kDhtProtocol, junk);
    CO_ASSERT_FALSE(r);
    EXPECT_TRUE(net::is_remote_error(r.error())) << r.error().message();
    EXPECT_EQ(c.node(0).bad_messages(), 1u);
    // The node still serves well-formed requests from the same peer.
    CO_ASSERT_OK(
        co_await c.node(1).store(RecordKey::from_string("k"), to_bytes("v"), Millis(60'000)));
    auto g = co_await c.node(0).get(RecordKey::from_string("k"));
    CO_ASSERT_OK(g);
    EXPECT_TRUE(g.value().has_value());
  });
}

TEST(DhtNode, BlockingFacade) {
  IoThread io("dht-test");
  auto host = net::Host::create(io.executor(), crypto::KeyPair::generate());
  auto started = block_on(
      io.executor(), [host] { return host->start(); }, 10s);
  ASSERT_TRUE(started) << started.error().message();
  auto node = DhtNode::create(host, quick_config());
  ASSERT_TRUE(block_on(
      io.executor(), [node] { return node->start(); }, 10s));
  BlockingDhtNode b(node);
  auto s = b.store(RecordKey::from_string("solo"), SubKey::from_string("a"), to_bytes("1"),
                   Millis(10'000));
  ASSERT_TRUE(s) << s.error().message();
  EXPECT_EQ(s.value().replicas, 1u);  // alone: only itself
  auto g = b.get(RecordKey::from_string("solo"));
  ASSERT_TRUE(g) << g.error().message();
  ASSERT_TRUE(g.value().has_value());
  EXPECT_EQ(g.value()->dictionary.size(), 1u);
  EXPECT_EQ(g.value()->hops, 0u);
  // A key it does not hold: alone, there is nobody to ask.
  auto missing = b.get(RecordKey::from_string("nothing here"));
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error(), errc::unavailable) << missing.error().message();
  auto stopped = block_on(
      io.executor(),
      [node, host]() -> awaitable<result<void>> {
        co_await node->stop();
        co_await host->stop();
        co_return success();
      },
      20s);
  EXPECT_TRUE(stopped);
}
