// Inbound admission at the connection limits: stale handshakes and idle inbound connections
// are evicted so that a flood cannot lock a real peer out.
#include <gtest/gtest.h>

#include <list>

#include "starling/core/log.hpp"
#include "starling/net/host.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

namespace {
std::shared_ptr<Host> make_host(asio::io_context& io, HostConfig cfg = {}) {
  return Host::create(io.get_executor(), crypto::KeyPair::generate(), cfg);
}

// Dials until it succeeds or `budget` runs out (a refused dial fails at once).
awaitable<result<PeerId>> connect_retrying(Host& h, const Multiaddr& addr, Duration budget,
                                           int& attempts) {
  const auto deadline = Clock::now() + budget;
  result<PeerId> r = make_error(errc::timeout, "no attempt");
  while (Clock::now() < deadline) {
    ++attempts;
    auto a = co_await h.connect(addr, 2s);
    if (a) co_return a;
    r = a.error();
  }
  co_return r;
}
}  // namespace

// Idle TCP connects that never send a byte fill every handshake slot. Before admission with
// eviction they held the slots for the whole dial_timeout (10 s) and every real dial was
// refused; now the stale ones are evicted once older than the grace.
TEST(HostAdmit, IdleConnectFloodCannotLockOutARealPeer) {
  asio::io_context io;
  HostConfig cfg;
  cfg.max_pending_inbound = 4;
  cfg.pending_inbound_grace = 200ms;
  auto a = make_host(io), b = make_host(io, cfg);
  std::list<asio::ip::tcp::socket> flood;
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await a->start());
    CO_ASSERT_OK(co_await b->start());
    auto addr = b->listen_addresses().at(0);
    auto ep = addr.to_tcp_endpoint().value();
    for (int i = 0; i < 16; ++i) {
      auto& s = flood.emplace_back(io);
      auto [ec] = co_await s.async_connect(ep, use_nothrow);
      EXPECT_FALSE(ec) << ec.message();
    }
    int attempts = 0;
    auto r = co_await connect_retrying(*a, addr, 5s, attempts);
    CO_ASSERT_OK(r);
    EXPECT_EQ(r.value(), b->local_peer());
    EXPECT_GE(b->stats().evicted_handshakes, 1u);
    EXPECT_GE(b->stats().rejected_connections, 1u);  // the flood beyond the slots
    // More flood after the peer got in does not touch its established connection.
    for (int i = 0; i < 8; ++i) {
      auto& s = flood.emplace_back(io);
      (void)co_await s.async_connect(ep, use_nothrow);
    }
    auto info = co_await a->wait_identified(b->local_peer(), 5s);
    CO_ASSERT_OK(info);
    EXPECT_TRUE(a->is_connected(b->local_peer()));
    co_await a->stop();
    co_await b->stop();
  });
}

// At max_connections, an idle inbound connection (no streams) is closed to admit a new one;
// one kept alive by a protocol is not.
TEST(HostAdmit, IdleInboundConnectionEvictedAtConnectionLimit) {
  asio::io_context io;
  HostConfig cfg;
  cfg.max_connections = 2;
  cfg.pending_inbound_grace = 0ms;
  auto b = make_host(io, cfg);
  auto c1 = make_host(io), c2 = make_host(io), a = make_host(io);
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await b->start());
    for (auto* h : {&c1, &c2, &a}) CO_ASSERT_OK(co_await (*h)->start());
    auto addr = b->listen_addresses().at(0);
    CO_ASSERT_OK(co_await c1->connect(addr));
    b->keep_alive(c1->local_peer(), true);  // c1 is wanted: never evicted
    CO_ASSERT_OK(co_await c2->connect(addr));
    CO_ASSERT_OK(co_await b->wait_identified(c2->local_peer(), 5s));
    int attempts = 0;
    auto r = co_await connect_retrying(*a, addr, 5s, attempts);
    CO_ASSERT_OK(r);
    EXPECT_EQ(b->stats().evicted_connections, 1u);
    EXPECT_TRUE(b->is_connected(c1->local_peer()));
    EXPECT_FALSE(b->is_connected(c2->local_peer()));
    for (auto* h : {&a, &b, &c1, &c2}) co_await (*h)->stop();
  });
}

// No eviction when nothing is stale: at the limit with only fresh handshakes, new connections
// are refused (so a flood cannot evict a real peer's handshake in progress).
TEST(HostAdmit, FreshHandshakesAreNotEvicted) {
  asio::io_context io;
  HostConfig cfg;
  cfg.max_pending_inbound = 2;
  cfg.pending_inbound_grace = 60s;
  auto b = make_host(io, cfg), a = make_host(io);
  std::list<asio::ip::tcp::socket> flood;
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await b->start());
    CO_ASSERT_OK(co_await a->start());
    auto addr = b->listen_addresses().at(0);
    auto ep = addr.to_tcp_endpoint().value();
    for (int i = 0; i < 2; ++i) {
      auto& s = flood.emplace_back(io);
      (void)co_await s.async_connect(ep, use_nothrow);
    }
    auto r = co_await a->connect(addr, 2s);
    EXPECT_FALSE(r);
    EXPECT_EQ(b->stats().evicted_handshakes, 0u);
    EXPECT_GE(b->stats().rejected_connections, 1u);
    co_await a->stop();
    co_await b->stop();
  });
}
