// AutoNAT v1: the confidence state machine, and client/server over loopback: reachable,
// unreachable, the observed-IP rule (no dialing a third party), rate limits, bad requests.
#include <gtest/gtest.h>

#include "starling/net/autonat.hpp"
#include "starling/net/host.hpp"
#include "starling/pb/autonat.pb.h"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

namespace {
std::shared_ptr<Host> make_host(asio::io_context& io, HostConfig cfg = {}) {
  return Host::create(io.get_executor(), crypto::KeyPair::generate(), cfg);
}

AutonatServerConfig loopback_server() {
  AutonatServerConfig c;
  c.allow_private = true;
  c.dial_timeout = 5s;
  return c;
}

AutonatClientConfig manual_client() {
  AutonatClientConfig c;
  c.servers_per_round = 0;  // the tests call probe() themselves
  c.timeout = 5s;
  return c;
}
}  // namespace

TEST(AutonatCore, ConfidenceRisesFallsAndFlips) {
  AutonatCore c(3);
  EXPECT_EQ(c.status(), Reachability::unknown);
  EXPECT_TRUE(c.record(true));
  EXPECT_EQ(c.status(), Reachability::public_);
  EXPECT_EQ(c.confidence(), 0);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(c.record(true));
  EXPECT_EQ(c.confidence(), 3);
  EXPECT_TRUE(c.confident());
  // One disagreeing answer lowers the confidence, it does not flip a confident status.
  EXPECT_FALSE(c.record(false));
  EXPECT_EQ(c.status(), Reachability::public_);
  EXPECT_EQ(c.confidence(), 2);
  EXPECT_FALSE(c.record(false));
  EXPECT_FALSE(c.record(false));
  EXPECT_EQ(c.confidence(), 0);
  EXPECT_TRUE(c.record(false));
  EXPECT_EQ(c.status(), Reachability::private_);
}

TEST(AutonatWire, RejectsMalformed) {
  EXPECT_FALSE(parse_autonat_dial(Bytes{0xff, 0x01}));
  pb::AutonatMessage m;
  m.set_type(pb::AutonatMessage::DIAL_RESPONSE);
  Bytes b(m.ByteSizeLong());
  m.SerializeToArray(b.data(), static_cast<int>(b.size()));
  EXPECT_FALSE(parse_autonat_dial(b));
  EXPECT_FALSE(parse_autonat_answer(b));  // no dialResponse
  Bytes huge(kMaxAutonatMessage + 1, 0);
  EXPECT_FALSE(parse_autonat_dial(huge));
}

struct AutonatFixture {
  asio::io_context io;
  std::vector<std::shared_ptr<Host>> servers;
  std::vector<std::shared_ptr<AutonatServer>> services;
  awaitable<result<void>> start_servers(int n, AutonatServerConfig cfg = loopback_server()) {
    for (int i = 0; i < n; ++i) {
      auto h = make_host(io);
      ST_CO_TRY(co_await h->start());
      services.push_back(AutonatServer::start(h, cfg));
      servers.push_back(h);
    }
    co_return success();
  }
  awaitable<void> stop_all() {
    for (auto& s : services) s->stop();
    for (auto& h : servers) co_await h->stop();
  }
};

TEST(Autonat, ReachableNodeBecomesPublic) {
  AutonatFixture f;
  auto a = make_host(f.io);
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await f.start_servers(3));
    CO_ASSERT_OK(co_await a->start());
    auto client = AutonatClient::start(a, manual_client());
    for (auto& s : f.servers) {
      CO_ASSERT_OK(co_await a->connect(s->listen_addresses().at(0)));
      auto ans = co_await client->probe(s->local_peer(), 5s);
      CO_ASSERT_OK(ans);
      EXPECT_EQ(ans.value().status, 0) << ans.value().text;
      EXPECT_TRUE(ans.value().addr.has_value());
    }
    EXPECT_EQ(client->status(), Reachability::public_);
    EXPECT_EQ(client->confidence(), 2);
    // Dial-backs ran on fresh connections that were closed again.
    EXPECT_EQ(f.services[0]->stats().dialed_ok, 1u);
    co_await client->stop();
    co_await a->stop();
    co_await f.stop_all();
  });
}

TEST(Autonat, UnreachableNodeBecomesPrivate) {
  AutonatFixture f;
  HostConfig hc;
  hc.announce = {"/ip4/127.0.0.1/tcp/1"};  // nothing listens there
  auto a = make_host(f.io, hc);
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await f.start_servers(2));
    CO_ASSERT_OK(co_await a->start());
    auto client = AutonatClient::start(a, manual_client());
    for (auto& s : f.servers) {
      CO_ASSERT_OK(co_await a->connect(s->listen_addresses().at(0)));
      auto ans = co_await client->probe(s->local_peer(), 10s);
      CO_ASSERT_OK(ans);
      EXPECT_EQ(ans.value().status, 100) << ans.value().text;
    }
    EXPECT_EQ(client->status(), Reachability::private_);
    co_await client->stop();
    co_await a->stop();
    co_await f.stop_all();
  });
}

TEST(Autonat, NeverDialsAThirdParty) {
  AutonatFixture f;
  HostConfig victim_cfg;
  victim_cfg.listen = {"/ip4/127.0.0.2/tcp/0"};
  auto victim = make_host(f.io, victim_cfg);
  auto a = make_host(f.io);
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await f.start_servers(1));
    CO_ASSERT_OK(co_await victim->start());
    CO_ASSERT_OK(co_await a->start());
    auto s = f.servers[0];
    CO_ASSERT_OK(co_await a->connect(s->listen_addresses().at(0)));
    // A asks the server to dial the victim's address (another IP than A's observed one).
    auto stream = co_await a->open_stream(s->local_peer(), kAutonatProtocol, 5s);
    CO_ASSERT_OK(stream);
    pb::AutonatMessage m;
    m.set_type(pb::AutonatMessage::DIAL);
    auto id = a->local_peer().bytes();
    m.mutable_dial()->mutable_peer()->set_id(id.data(), id.size());
    auto vb = victim->listen_addresses().at(0).without_peer_id().to_bytes();
    m.mutable_dial()->mutable_peer()->add_addrs(vb.data(), vb.size());
    Bytes bytes(m.ByteSizeLong());
    m.SerializeToArray(bytes.data(), static_cast<int>(bytes.size()));
    CO_ASSERT_OK(co_await write_length_prefixed(*stream.value(), bytes));
    BufferedReader reader(*stream.value());
    auto msg = co_await reader.read_length_prefixed(kMaxAutonatMessage);
    CO_ASSERT_OK(msg);
    auto ans = parse_autonat_answer(msg.value());
    CO_ASSERT_OK(ans);
    EXPECT_EQ(ans.value().status, 101) << ans.value().text;
    EXPECT_EQ(victim->stats().inbound_connections, 0u);
    EXPECT_EQ(victim->connection_count(), 0u);
    co_await victim->stop();
    co_await a->stop();
    co_await f.stop_all();
  });
}

TEST(Autonat, RateLimitAndBadRequest) {
  AutonatFixture f;
  auto a = make_host(f.io);
  auto cfg = loopback_server();
  cfg.max_per_peer = 1;
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await f.start_servers(1, cfg));
    CO_ASSERT_OK(co_await a->start());
    auto client = AutonatClient::start(a, manual_client());
    auto s = f.servers[0];
    CO_ASSERT_OK(co_await a->connect(s->listen_addresses().at(0)));
    auto first = co_await client->probe(s->local_peer(), 5s);
    CO_ASSERT_OK(first);
    EXPECT_EQ(first.value().status, 0);
    auto second = co_await client->probe(s->local_peer(), 5s);
    CO_ASSERT_OK(second);
    EXPECT_EQ(second.value().status, 101);
    EXPECT_EQ(client->confidence(), 0);  // a refusal is not recorded
    // A DIAL naming another peer than the requester: E_BAD_REQUEST.
    auto stream = co_await a->open_stream(s->local_peer(), kAutonatProtocol, 5s);
    CO_ASSERT_OK(stream);
    pb::AutonatMessage m;
    m.set_type(pb::AutonatMessage::DIAL);
    auto other = s->local_peer().bytes();
    m.mutable_dial()->mutable_peer()->set_id(other.data(), other.size());
    Bytes bytes(m.ByteSizeLong());
    m.SerializeToArray(bytes.data(), static_cast<int>(bytes.size()));
    CO_ASSERT_OK(co_await write_length_prefixed(*stream.value(), bytes));
    BufferedReader reader(*stream.value());
    auto msg = co_await reader.read_length_prefixed(kMaxAutonatMessage);
    CO_ASSERT_OK(msg);
    auto ans = parse_autonat_answer(msg.value());
    CO_ASSERT_OK(ans);
    EXPECT_EQ(ans.value().status, 200);
    EXPECT_EQ(f.services[0]->stats().bad_requests, 1u);
    co_await client->stop();
    co_await a->stop();
    co_await f.stop_all();
  });
}

TEST(Autonat, BackgroundLoopFindsServers) {
  AutonatFixture f;
  auto a = make_host(f.io);
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await f.start_servers(2));
    CO_ASSERT_OK(co_await a->start());
    AutonatClientConfig cc;
    cc.timeout = 5s;
    auto client = AutonatClient::start(a, cc);
    for (auto& s : f.servers) CO_ASSERT_OK(co_await a->connect(s->listen_addresses().at(0)));
    CO_ASSERT_OK(co_await client->wait_status(Reachability::public_, 10s));
    co_await client->stop();
    co_await a->stop();
    co_await f.stop_all();
  });
}

// A new direct address (a port mapping, "portmap") makes the client ask again at once, not
// after retry_interval: here an hour, so without the re-check the second request never comes.
TEST(Autonat, NewAddressIsCheckedAtOnce) {
  AutonatFixture f;
  auto a = make_host(f.io);
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await f.start_servers(1));
    CO_ASSERT_OK(co_await a->start());
    AutonatClientConfig cc;
    cc.timeout = 5s;
    cc.retry_interval = 1h;
    cc.interval = 1h;
    auto client = AutonatClient::start(a, cc);
    CO_ASSERT_OK(co_await a->connect(f.servers[0]->listen_addresses().at(0)));
    CO_ASSERT_OK(co_await client->wait_status(Reachability::public_, 10s));
    const auto& st = f.services[0]->stats();
    const auto before = st.requests;
    const auto port = a->listen_addresses().at(0).to_tcp_endpoint().value().port();
    a->set_extra_addresses(
        "portmap", {Multiaddr::from_tcp_endpoint({asio::ip::make_address("127.0.0.2"), port})});
    const auto deadline = Clock::now() + 10s;
    while (st.requests == before && Clock::now() < deadline) (void)co_await sleep_for(10ms);
    EXPECT_GT(st.requests, before);
    co_await client->stop();
    co_await a->stop();
    co_await f.stop_all();
  });
}
