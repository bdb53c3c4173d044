// The Host's peer table is bounded (HostConfig::max_known_peers): a flood of hearsay about
// made-up peers forgets the least recently useful ones, never a connected peer or one being
// dialled; peers we met and hearsay each keep half the table; the heap stays flat.
#include <gtest/gtest.h>
#include <malloc.h>

#include <asio/ip/tcp.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "starling/core/async.hpp"
#include "starling/net/host.hpp"
#include "support/fake_host.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

namespace {

Multiaddr addr(int n) {
  return Multiaddr::parse("/ip4/10." + std::to_string((n >> 16) & 255) + "." +
                          std::to_string((n >> 8) & 255) + "." + std::to_string(n & 255) +
                          "/tcp/4001")
      .value();
}

// Hearsay about `count` made-up peers (ids from..from+count-1), `per` addresses each.
void gossip(Host& h, std::uint32_t from, int count, int per = 1,
            AddrSource source = AddrSource::hearsay) {
  for (int i = 0; i < count; ++i) {
    std::vector<Multiaddr> v;
    for (int j = 0; j < per; ++j) v.push_back(addr(i * per + j));
    h.add_addresses(test::make_peer_id(from + static_cast<std::uint32_t>(i)), v, source);
  }
}

bool known(const Host& h, const PeerId& p) {
  return h.peer_info(p).has_value();
}

// Accepts one connection and never answers: a dial to it stays in progress until closed.
struct Silent {
  explicit Silent(asio::any_io_executor ex)
      : acceptor(ex, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0)), accepted(ex) {}
  asio::ip::tcp::acceptor acceptor;
  asio::ip::tcp::socket held{acceptor.get_executor()};
  AsyncEvent accepted;
  awaitable<void> accept_one() {
    auto [ec, s] = co_await acceptor.async_accept(use_nothrow);
    if (!ec) held = std::move(s);
    accepted.set();
  }
  void close() {
    std::error_code ec;
    acceptor.close(ec);
    held.close(ec);
  }
};

std::size_t heap_in_use() {
  const auto m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

}  // namespace

TEST(HostPeers, DefaultCapIsDocumentedValue) {
  EXPECT_EQ(HostConfig{}.max_known_peers, 4096u);
  EXPECT_EQ(kMaxKnownPeers, 4096u);
}

TEST(HostPeers, FloodForgetsHearsayNeverConnectedOrDialledPeers) {
  constexpr std::size_t kCap = 32;
  asio::io_context io;
  HostConfig cfg;
  cfg.max_known_peers = kCap;
  auto a = Host::create(io.get_executor(), crypto::KeyPair::generate(), cfg);
  auto b = Host::create(io.get_executor(), crypto::KeyPair::generate());  // a dials it
  auto c = Host::create(io.get_executor(), crypto::KeyPair::generate());  // dials a
  auto e = Host::create(io.get_executor(), crypto::KeyPair::generate());  // met, then gone
  const auto d = PeerId::from_public_key(crypto::KeyPair::generate().public_key());
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    for (auto& h : {a, b, c, e}) CO_ASSERT_OK(co_await h->start());
    CO_ASSERT_OK(co_await a->connect(b->listen_addresses().at(0), 5s));
    CO_ASSERT_OK(co_await c->connect(a->listen_addresses().at(0), 5s));
    CO_ASSERT_OK(co_await a->wait_identified(b->local_peer(), 5s));
    CO_ASSERT_OK(co_await a->wait_identified(c->local_peer(), 5s));
    CO_ASSERT_OK(co_await a->connect(e->listen_addresses().at(0), 5s));
    AsyncEvent e_gone(ex);
    a->on_peer_disconnected([&](const PeerId& p) {
      if (p == e->local_peer()) e_gone.set();
    });
    a->disconnect(e->local_peer());
    CO_ASSERT_OK(co_await with_timeout(e_gone.wait(), 5s, "disconnect e"));

    // A dial to d is in progress (its listener never answers).
    Silent hole(ex);
    TaskScope scope(ex);
    scope.spawn([&]() -> awaitable<void> { co_await hole.accept_one(); });
    AsyncEvent dial_done(ex);
    scope.spawn([&]() -> awaitable<void> {
      auto r = co_await a->connect(
          Multiaddr::from_tcp_endpoint(hole.acceptor.local_endpoint()).with_peer_id(d), 10s);
      EXPECT_FALSE(r.has_value());
      dial_done.set();
    });
    CO_ASSERT_OK(co_await with_timeout(hole.accepted.wait(), 5s, "dial reaches the hole"));
    CO_ASSERT_TRUE(a->known_peer_count() == 4u);  // b, c, e, d

    constexpr int kFlood = 10 * kCap;
    gossip(*a, 1000, kFlood);
    EXPECT_EQ(a->known_peer_count(), kCap);
    EXPECT_EQ(a->stats().forgotten_peers, 4 + kFlood - kCap);
    for (const auto& p : {b->local_peer(), c->local_peer(), e->local_peer(), d})
      EXPECT_TRUE(known(*a, p)) << p.short_string();
    EXPECT_FALSE(a->peer_info(b->local_peer())->addrs.empty());
    EXPECT_TRUE(a->peer_info(c->local_peer())->identified);
    // The newest hearsay stays (kCap - 4 of it), the older goes.
    EXPECT_TRUE(known(*a, test::make_peer_id(1000 + kFlood - 1)));
    EXPECT_TRUE(known(*a, test::make_peer_id(1000 + kFlood - (kCap - 4))));
    EXPECT_FALSE(known(*a, test::make_peer_id(1000 + kFlood - (kCap - 4) - 1)));
    EXPECT_FALSE(known(*a, test::make_peer_id(1000)));
    EXPECT_TRUE(a->is_connected(b->local_peer()));
    EXPECT_TRUE(a->is_connected(c->local_peer()));

    // The dial ends: d is hearsay no longer pinned, older than the next flood, so it goes;
    // e, which we met, outlives hearsay.
    hole.close();
    CO_ASSERT_OK(co_await with_timeout(dial_done.wait(), 5s, "dial to d fails"));
    gossip(*a, 5000, kCap);
    EXPECT_EQ(a->known_peer_count(), kCap);
    EXPECT_FALSE(known(*a, d));
    for (const auto& p : {b->local_peer(), c->local_peer(), e->local_peer()})
      EXPECT_TRUE(known(*a, p)) << p.short_string();
    // Peers we met crowd the table: the least recently useful met peer (e) goes, the
    // connected ones (older still) stay.
    gossip(*a, 9000, 2 * kCap, 1, AddrSource::dialed);
    EXPECT_EQ(a->known_peer_count(), kCap);
    EXPECT_FALSE(known(*a, e->local_peer()));
    EXPECT_TRUE(known(*a, b->local_peer()));
    EXPECT_TRUE(known(*a, c->local_peer()));
    (void)co_await scope.close(1s);
    for (auto& h : {a, b, c, e}) co_await h->stop();
  });
}

TEST(HostPeers, MetPeersAndHearsayEachKeepHalf) {
  constexpr std::size_t kCap = 32;
  asio::io_context io;
  HostConfig cfg;
  cfg.max_known_peers = kCap;
  auto a = Host::create(io.get_executor(), crypto::KeyPair::generate(), cfg);
  // Peers a dial confirmed (as after connections closed) fill the table, oldest forgotten.
  gossip(*a, 1, 40, 1, AddrSource::dialed);
  EXPECT_EQ(a->known_peer_count(), kCap);
  EXPECT_FALSE(known(*a, test::make_peer_id(1 + 7)));
  EXPECT_TRUE(known(*a, test::make_peer_id(1 + 8)));
  // Hearsay gets half the table (so a lookup can still dial what it hears of), no more: the
  // most recently useful half of the met peers stays.
  gossip(*a, 1000, 100);
  EXPECT_EQ(a->known_peer_count(), kCap);
  for (std::uint32_t i = 0; i < 40; ++i)
    EXPECT_EQ(known(*a, test::make_peer_id(1 + i)), i >= 40 - kCap / 2) << i;
  for (std::uint32_t i = 0; i < 100; ++i)
    EXPECT_EQ(known(*a, test::make_peer_id(1000 + i)), i >= 100 - kCap / 2) << i;
  EXPECT_EQ(a->stats().forgotten_peers, 40 + 100 - kCap);
}

TEST(HostPeers, HeapStaysFlatPastTheCap) {
  constexpr std::size_t kCap = 256;
  asio::io_context io;
  HostConfig cfg;
  cfg.max_known_peers = kCap;
  auto a = Host::create(io.get_executor(), crypto::KeyPair::generate(), cfg);
  const auto base = heap_in_use();
  if (base == 0) GTEST_SKIP() << "mallinfo2 unavailable (sanitizer build)";
  gossip(*a, 1, kCap, 16);  // a full table, each peer with a full address book
  const auto full = heap_in_use();
  gossip(*a, 100000, 20 * kCap, 16);  // twenty times as many peers again
  const auto flooded = heap_in_use();
  EXPECT_EQ(a->known_peer_count(), kCap);
  const auto grow = [](std::size_t from, std::size_t to) {
    return to > from ? static_cast<double>(to - from) : 0.0;
  };
  std::printf("peer table heap: %.0f KiB for %zu peers, +%.0f KiB after %zu more\n",
              grow(base, full) / 1024, kCap, grow(full, flooded) / 1024, 20 * kCap);
  ASSERT_GT(grow(base, full), 0.0);
  // Unbounded, the flood would add twenty times the full table's heap.
  EXPECT_LT(grow(full, flooded), 0.25 * grow(base, full));
}
