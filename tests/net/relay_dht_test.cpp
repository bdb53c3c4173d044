// A private peer's DHT node announces the /p2p-circuit addresses of its relay reservations,
// and stops announcing them when the reservation ends.
#include <gtest/gtest.h>

#include "starling/dht/node.hpp"
#include "starling/net/host.hpp"
#include "starling/net/relay.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

TEST(RelayDht, AnnouncedAddressesFollowReservations) {
  asio::io_context io;
  auto r = Host::create(io.get_executor(), crypto::KeyPair::generate());
  auto b = Host::create(io.get_executor(), crypto::KeyPair::generate());
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await r->start());
    CO_ASSERT_OK(co_await b->start());
    auto service = RelayService::start(r);
    auto rnode = dht::DhtNode::create(r);
    std::vector<Multiaddr> none;  // a named local: GCC 12 destroys a braced temporary twice
    CO_ASSERT_OK(co_await rnode->start(none));
    auto bnode = dht::DhtNode::create(b);
    std::vector<Multiaddr> boot{r->listen_addresses().at(0)};
    CO_ASSERT_OK(co_await bnode->start(boot));
    auto has_circuit = [&] {
      auto ann = bnode->announced();
      return std::any_of(ann.begin(), ann.end(), [](const Multiaddr& a) { return a.is_circuit(); });
    };
    EXPECT_FALSE(has_circuit());
    RelayClientConfig cc;
    cc.relays = boot;
    auto client = RelayClient::start(b, cc);
    CO_ASSERT_OK(co_await client->wait_reservations(1, 5s));
    EXPECT_TRUE(has_circuit());
    co_await client->stop();
    EXPECT_FALSE(has_circuit());
    co_await bnode->stop();
    co_await rnode->stop();
    co_await service->stop();
    co_await b->stop();
    co_await r->stop();
  });
}
