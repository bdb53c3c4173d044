// Dialing under cancellation: a dial cancelled from outside (a round or a matchmaking session
// closing its scope mid-dial) must leave the Host able to dial that peer again.
#include <gtest/gtest.h>

#include <asio/ip/tcp.hpp>

#include <memory>
#include <vector>

#include "starling/core/async.hpp"
#include "starling/net/echo.hpp"
#include "starling/net/host.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

namespace {

// A TCP listener that accepts connections and never answers: a dial to it stalls in the
// handshake until its deadline or cancellation.
struct BlackHole {
  explicit BlackHole(asio::any_io_executor ex)
      : acceptor(ex, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0)) {}
  asio::ip::tcp::acceptor acceptor;
  std::vector<asio::ip::tcp::socket> held;

  Multiaddr addr() const { return Multiaddr::from_tcp_endpoint(acceptor.local_endpoint()); }
  awaitable<void> accept_forever() {
    for (;;) {
      auto [ec, s] = co_await acceptor.async_accept(use_nothrow);
      if (ec) co_return;
      held.push_back(std::move(s));
    }
  }
  void close() {
    std::error_code ec;
    acceptor.close(ec);
    for (auto& s : held) s.close(ec);
  }
};

}  // namespace

TEST(HostDial, CancelledDialLeavesThePeerDialable) {
  asio::io_context io;
  auto a = Host::create(io.get_executor(), crypto::KeyPair::generate());
  auto b = Host::create(io.get_executor(), crypto::KeyPair::generate());
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await a->start());
    CO_ASSERT_OK(co_await b->start());
    install_echo(*b);
    auto ex = co_await asio::this_coro::executor;
    TaskScope scope(ex);
    std::vector<std::unique_ptr<BlackHole>> holes;
    std::vector<Multiaddr> addrs;
    for (int i = 0; i < 3; ++i) {
      holes.push_back(std::make_unique<BlackHole>(ex));
      auto* h = holes.back().get();
      scope.spawn([h]() -> awaitable<void> { co_await h->accept_forever(); });
      addrs.push_back(h->addr());
    }
    for (auto& la : b->listen_addresses()) addrs.push_back(la.without_peer_id());
    a->add_addresses(b->local_peer(), addrs);

    // Each attempt stalls on a black hole and is cancelled from outside well before its own
    // dial deadline. Whether the cancelled handshake reports "cancelled" or "timeout" is a
    // race inside asio, so several attempts cover both paths.
    for (int i = 0; i < 8; ++i) {
      auto cancelled = co_await with_timeout(a->open_stream(b->local_peer(), kEchoProtocol, 30s),
                                             50ms, "cancelled from outside");
      EXPECT_FALSE(cancelled.has_value());
    }
    // The holes now refuse at once: the next dial must go on to the real address.
    for (auto& h : holes) h->close();
    auto s = co_await a->open_stream(b->local_peer(), kEchoProtocol, 10s);
    CO_ASSERT_OK(s);
    EXPECT_TRUE(a->is_connected(b->local_peer()));
    (void)co_await s.value()->close_write();
    co_await scope.close(1s);
    co_await a->stop();
    co_await b->stop();
  });
}
