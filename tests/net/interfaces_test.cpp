// Announced addresses: unspecified listen addresses expanded to interface addresses.
#include <gtest/gtest.h>

#include "starling/net/host.hpp"
#include "starling/net/interfaces.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

namespace {
Multiaddr ma(const char* s) {
  return Multiaddr::parse(s).value();
}
}  // namespace

TEST(Interfaces, ExpandUnspecifiedNonLoopbackFirst) {
  std::vector<asio::ip::address> ifs{
      asio::ip::make_address("127.0.0.1"), asio::ip::make_address("10.1.2.3"),
      asio::ip::make_address("::1"), asio::ip::make_address("2001:db8::5")};
  auto out = expand_unspecified({ma("/ip4/0.0.0.0/tcp/4001"), ma("/ip4/1.2.3.4/tcp/5"),
                                 ma("/ip6/::/tcp/4002"), ma("/ip4/0.0.0.0/tcp/4001")},
                                ifs);
  std::vector<std::string> got;
  for (auto& a : out) got.push_back(a.to_string());
  std::vector<std::string> want{"/ip4/10.1.2.3/tcp/4001", "/ip4/1.2.3.4/tcp/5",
                                "/ip6/2001:db8::5/tcp/4002", "/ip4/127.0.0.1/tcp/4001",
                                "/ip6/::1/tcp/4002"};
  EXPECT_EQ(got, want);
}

TEST(Interfaces, ListsLoopbackLast) {
  auto ifs = interface_addresses();
  ASSERT_FALSE(ifs.empty());
  bool seen_loopback = false;
  for (auto& ip : ifs) {
    if (ip.is_loopback()) {
      seen_loopback = true;
    } else {
      EXPECT_FALSE(seen_loopback) << ip.to_string() << " after a loopback address";
    }
    EXPECT_FALSE(ip.is_unspecified());
  }
  EXPECT_TRUE(seen_loopback);
}

TEST(Interfaces, PublicRanges) {
  for (auto s : {"10.0.0.1", "192.168.1.1", "172.20.0.1", "100.64.0.1", "127.0.0.1", "0.0.0.0",
                 "169.254.1.1", "fd00::1", "::1", "fe80::1", "203.0.113.9"})
    EXPECT_FALSE(is_public_ip(asio::ip::make_address(s))) << s;
  for (auto s : {"8.8.8.8", "1.2.3.4", "2606:4700::1111"})
    EXPECT_TRUE(is_public_ip(asio::ip::make_address(s))) << s;
}

TEST(Interfaces, HostAnnouncesNoUnspecifiedAddress) {
  asio::io_context io;
  HostConfig cfg;
  cfg.listen = {"/ip4/0.0.0.0/tcp/0"};
  auto a = Host::create(io.get_executor(), crypto::KeyPair::generate(), cfg);
  auto b = Host::create(io.get_executor(), crypto::KeyPair::generate());
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await a->start());
    CO_ASSERT_OK(co_await b->start());
    auto ann = a->announce_addresses();
    EXPECT_FALSE(ann.empty());
    for (auto& m : ann) {
      EXPECT_EQ(m.to_string().find("0.0.0.0"), std::string::npos) << m.to_string();
      EXPECT_EQ(m.peer_id(), a->local_peer());
    }
    EXPECT_FALSE(multiaddr_ip(ann.front()).value().is_loopback() &&
                 interface_addresses().front().is_v4() &&
                 !interface_addresses().front().is_loopback());
    // Identify carries them, and the dialer sees what it was observed as.
    auto peer = co_await b->connect(ann.back());  // the loopback one
    CO_ASSERT_OK(peer);
    auto info = co_await b->wait_identified(a->local_peer(), 5s);
    CO_ASSERT_OK(info);
    for (auto& m : info.value().addrs)
      EXPECT_EQ(m.to_string().find("0.0.0.0"), std::string::npos) << m.to_string();
    auto back = co_await a->wait_identified(b->local_peer(), 5s);
    CO_ASSERT_OK(back);
    auto obs = b->observed_addresses();
    EXPECT_EQ(obs.size(), 1u);
    if (!obs.empty()) {
      EXPECT_EQ(multiaddr_ip(obs[0]).value().to_string(), "127.0.0.1");
    }
    co_await a->stop();
    co_await b->stop();
  });
}
