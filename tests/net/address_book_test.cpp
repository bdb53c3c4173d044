// The address book's bound and ranking (AddressBook alone), and the Host using it: gossip of
// thousands of addresses keeps 16, an explicit address is still dialled, and dialled or
// self-announced addresses stay ahead of hearsay, so a dial does not crawl through junk.
#include <gtest/gtest.h>

#include <asio/ip/tcp.hpp>

#include <string>
#include <vector>

#include "starling/net/address_book.hpp"
#include "starling/net/echo.hpp"
#include "starling/net/host.hpp"
#include "support/fake_host.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

namespace {

Multiaddr addr(int port, const char* ip = "192.0.2.1") {
  return Multiaddr::parse("/ip4/" + std::string(ip) + "/tcp/" + std::to_string(port)).value();
}

std::vector<Multiaddr> addrs(int from, int count) {
  std::vector<Multiaddr> v;
  for (int i = 0; i < count; ++i) v.push_back(addr(from + i));
  return v;
}

}  // namespace

TEST(AddressBook, KeepsAtMostCapInGivenOrder) {
  AddressBook book;
  const auto peer = test::make_peer_id(1);
  const auto& got = book.add(peer, addrs(1, 5000), AddrSource::hearsay);
  ASSERT_EQ(got.size(), kMaxAddrsPerPeer);
  EXPECT_EQ(kMaxAddrsPerPeer, 16u);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], addr(1 + int(i)));
  EXPECT_TRUE(book.addrs(test::make_peer_id(2)).empty());
}

TEST(AddressBook, ConfirmedBeatHearsayAndNewerBeatOlder) {
  AddressBook book(4);
  const auto peer = test::make_peer_id(1);
  book.add(peer, {addr(1), addr(2)}, AddrSource::peer);
  book.add(peer, {addr(3)}, AddrSource::dialed);
  // Hearsay fills only what is left, newest first; it never displaces a confirmed address.
  book.add(peer, addrs(100, 10), AddrSource::hearsay);
  EXPECT_EQ(book.addrs(peer), (std::vector{addr(3), addr(1), addr(2), addr(100)}));
  book.add(peer, {addr(200)}, AddrSource::hearsay);
  EXPECT_EQ(book.addrs(peer), (std::vector{addr(3), addr(1), addr(2), addr(200)}));
  // The peer announces a new list: most recent first, older announcements after it.
  book.add(peer, {addr(5), addr(6)}, AddrSource::peer);
  EXPECT_EQ(book.addrs(peer), (std::vector{addr(3), addr(5), addr(6), addr(1)}));
  // A dial confirms addr(6): it moves to the top.
  book.add(peer, {addr(6)}, AddrSource::dialed);
  EXPECT_EQ(book.addrs(peer), (std::vector{addr(6), addr(3), addr(5), addr(1)}));
  // Hearsay about a confirmed address neither demotes nor refreshes it.
  book.add(peer, {addr(3), addr(1)}, AddrSource::hearsay);
  EXPECT_EQ(book.addrs(peer), (std::vector{addr(6), addr(3), addr(5), addr(1)}));
}

TEST(AddressBook, DuplicatesInABatchCountOnce) {
  AddressBook book(3);
  const auto peer = test::make_peer_id(1);
  book.add(peer, {addr(1), addr(1), addr(1), addr(2), addr(3)}, AddrSource::peer);
  EXPECT_EQ(book.addrs(peer), (std::vector{addr(1), addr(2), addr(3)}));
}

TEST(HostAddrs, GossipIsCappedAndConfirmedAddressesGoFirst) {
  asio::io_context io;
  HostConfig bcfg;
  bcfg.listen = {"/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/tcp/0"};
  auto a = Host::create(io.get_executor(), crypto::KeyPair::generate());
  auto b = Host::create(io.get_executor(), crypto::KeyPair::generate(), bcfg);
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await a->start());
    CO_ASSERT_OK(co_await b->start());
    install_echo(*b);
    const auto bid = b->local_peer();
    const auto listen = b->listen_addresses();
    CO_ASSERT_TRUE(listen.size() == 2);

    // A hostile peer gossips thousands of addresses for b.
    a->add_addresses(bid, addrs(1, 3000));
    EXPECT_EQ(a->peer_info(bid)->addrs.size(), 16u);

    // An explicit address is still dialled, first, although the book is full of hearsay.
    auto c = co_await a->connect(listen[0], 5s);
    CO_ASSERT_OK(c);
    auto info = co_await a->wait_identified(bid, 5s);
    CO_ASSERT_OK(info);
    auto known = a->peer_info(bid)->addrs;
    CO_ASSERT_TRUE(known.size() == 16u);
    EXPECT_EQ(known[0], listen[0].without_peer_id());  // dialled
    EXPECT_EQ(known[1], listen[1].without_peer_id());  // announced by b itself

    // More gossip changes nothing ahead of it.
    a->add_addresses(bid, addrs(5000, 3000));
    known = a->peer_info(bid)->addrs;
    CO_ASSERT_TRUE(known.size() == 16u);
    EXPECT_EQ(known[0], listen[0].without_peer_id());
    EXPECT_EQ(known[1], listen[1].without_peer_id());
    EXPECT_EQ(known[2], addr(5000));  // newest hearsay first

    // Reconnecting by id tries the confirmed address first (dials follow the book's order),
    // not the unroutable gossip.
    AsyncEvent gone(io.get_executor());
    a->on_peer_disconnected([&](const PeerId& p) {
      if (p == bid) gone.set();
    });
    a->disconnect(bid);
    auto g = co_await with_timeout(gone.wait(), 5s, "disconnect");
    CO_ASSERT_OK(g);
    auto s = co_await a->open_stream(bid, kEchoProtocol, 3s);
    CO_ASSERT_OK(s);
    (void)co_await s.value()->close_write();
    co_await a->stop();
    co_await b->stop();
  });
}
