// Circuit relay v2 over loopback: reservations, /p2p-circuit dials with Noise end to end,
// the service's limits and status codes, vouchers, and bad input.
#include <gtest/gtest.h>

#include <sodium.h>

#include <ctime>
#include <future>

#include "net/relay_internal.hpp"
#include "starling/core/blocking.hpp"
#include "starling/net/autonat.hpp"
#include "starling/net/echo.hpp"
#include "starling/net/host.hpp"
#include "starling/net/multistream.hpp"
#include "starling/net/noise.hpp"
#include "starling/net/relay.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

namespace {
std::shared_ptr<Host> make_host(asio::io_context& io) {
  HostConfig cfg;
  cfg.hole_punching = true;  // PunchedDirectConnectionPreferredOverRelay dials from the port
  return Host::create(io.get_executor(), crypto::KeyPair::generate(), cfg);
}

Bytes random_bytes(std::size_t n) {
  Bytes b(n);
  randombytes_buf(b.data(), b.size());
  return b;
}

// A relay R, a private peer B holding a reservation with R, and a dialer A.
struct Trio {
  asio::io_context io;
  std::shared_ptr<Host> r = make_host(io), a = make_host(io), b = make_host(io);
  std::shared_ptr<RelayService> service;
  std::shared_ptr<RelayClient> client;

  awaitable<result<Multiaddr>> setup(RelayServiceConfig rc = {}) {
    ST_CO_TRY(co_await r->start());
    ST_CO_TRY(co_await a->start());
    ST_CO_TRY(co_await b->start());
    install_echo(*b);
    service = RelayService::start(r, rc);
    RelayClientConfig cc;
    cc.relays = {r->listen_addresses().at(0)};
    client = RelayClient::start(b, cc);
    ST_CO_TRY(co_await client->wait_reservations(1, 10s));
    auto held = client->reservations();
    if (held.empty() || held[0].addrs.empty())
      co_return make_error(errc::internal, "reservation without addresses");
    co_return held[0].addrs[0].with_peer_id(b->local_peer());
  }
  awaitable<void> teardown() {
    if (client) co_await client->stop();
    if (service) co_await service->stop();
    co_await a->stop();
    co_await b->stop();
    co_await r->stop();
  }
};

awaitable<result<pb::HopMessage>> hop_exchange(Host& from, const PeerId& relay,
                                               BytesView raw_request) {
  ST_CO_TRY(auto s, co_await from.open_stream(relay, kRelayHopProtocol, 5s));
  ST_CO_TRY(co_await write_length_prefixed(*s, raw_request));
  ST_CO_TRY(auto got, co_await read_relay_message(*s, 5s));
  co_return parse_hop(got.first);
}
}  // namespace

TEST(RelayVoucher, SealOpenAndTamper) {
  auto relay = crypto::KeyPair::generate();
  auto peer = PeerId::from_public_key(crypto::KeyPair::generate().public_key());
  RelayVoucher v{PeerId::from_public_key(relay.public_key()), peer, 1'900'000'000};
  auto env = seal_voucher(relay, v);
  auto back = open_voucher(env);
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back.value().relay, v.relay);
  EXPECT_EQ(back.value().peer, peer);
  EXPECT_EQ(back.value().expiration, v.expiration);
  for (std::size_t i = 0; i < env.size(); i += 7) {
    auto bad = env;
    bad[i] ^= 0x01;
    EXPECT_FALSE(open_voucher(bad)) << "flipped byte " << i;
  }
  // Signed by another key than the voucher's relay.
  auto other = crypto::KeyPair::generate();
  EXPECT_FALSE(open_voucher(seal_voucher(other, v)));
}

TEST(Relay, ReserveDialEchoThroughCircuit) {
  Trio t;
  test::run_with_deadline(t.io, [&]() -> awaitable<void> {
    auto circuit = co_await t.setup();
    CO_ASSERT_OK(circuit);
    EXPECT_TRUE(circuit.value().is_circuit());
    // B announces its circuit address.
    auto ann = t.b->announce_addresses();
    EXPECT_NE(std::find(ann.begin(), ann.end(), circuit.value()), ann.end());
    EXPECT_TRUE(t.client->reservations().at(0).voucher.has_value());
    auto peer = co_await t.a->connect(circuit.value());
    CO_ASSERT_OK(peer);
    EXPECT_EQ(peer.value(), t.b->local_peer());
    auto conns = t.a->connections();
    auto it = std::find_if(conns.begin(), conns.end(),
                           [&](auto& c) { return c.peer == t.b->local_peer(); });
    EXPECT_TRUE(it != conns.end() && it->relayed && it->outbound);
    auto data = random_bytes(100 * 1024);
    auto echoed = co_await echo(*t.a, t.b->local_peer(), data, 10s);
    CO_ASSERT_OK(echoed);
    EXPECT_TRUE(echoed.value() == data);
    auto rtt = co_await ping(*t.a, t.b->local_peer(), 3, 5s);
    CO_ASSERT_OK(rtt);
    // B saw an inbound relayed connection from A, and identify ran over it.
    auto info = co_await t.b->wait_identified(t.a->local_peer(), 5s);
    CO_ASSERT_OK(info);
    auto bconns = t.b->connections();
    EXPECT_TRUE(std::any_of(bconns.begin(), bconns.end(), [&](auto& c) {
      return c.peer == t.a->local_peer() && c.relayed && !c.outbound;
    }));
    EXPECT_EQ(t.service->stats().circuits_opened, 1u);
    co_await t.teardown();
  });
}

TEST(Relay, NoReservationIsRefused) {
  Trio t;
  test::run_with_deadline(t.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await t.setup());
    auto c = make_host(t.io);
    CO_ASSERT_OK(co_await c->start());
    auto addr = t.r->listen_addresses().at(0).with_circuit().with_peer_id(c->local_peer());
    auto r = co_await t.a->connect(addr, 5s);
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_NE(r.error().message().find("NO_RESERVATION"), std::string::npos)
          << r.error().message();
    }
    EXPECT_EQ(t.service->stats().circuits_refused, 1u);
    co_await c->stop();
    co_await t.teardown();
  });
}

TEST(Relay, DataLimitResetsCircuit) {
  Trio t;
  test::run_with_deadline(t.io, [&]() -> awaitable<void> {
    RelayServiceConfig rc;
    rc.circuit_data = 64 * 1024;
    auto circuit = co_await t.setup(rc);
    CO_ASSERT_OK(circuit);
    CO_ASSERT_OK(co_await t.a->connect(circuit.value()));
    auto data = random_bytes(1 << 20);
    auto echoed = co_await echo(*t.a, t.b->local_peer(), data, 10s);
    EXPECT_FALSE(echoed);
    EXPECT_GE(t.service->stats().circuits_limited, 1u);
    co_await t.teardown();
  });
}

TEST(Relay, DurationLimitResetsCircuit) {
  Trio t;
  test::run_with_deadline(t.io, [&]() -> awaitable<void> {
    RelayServiceConfig rc;
    rc.circuit_duration = 300ms;
    auto circuit = co_await t.setup(rc);
    CO_ASSERT_OK(circuit);
    CO_ASSERT_OK(co_await t.a->connect(circuit.value()));
    // The relayed connection goes away on its own once the duration has passed.
    auto deadline = Clock::now() + 10s;
    while (t.a->is_connected(t.b->local_peer()) && Clock::now() < deadline)
      (void)co_await sleep_for(20ms);
    EXPECT_FALSE(t.a->is_connected(t.b->local_peer()));
    EXPECT_GE(t.service->stats().circuits_limited, 1u);
    co_await t.teardown();
  });
}

TEST(Relay, ReservationLimitsAndDropOnDisconnect) {
  Trio t;
  test::run_with_deadline(t.io, [&]() -> awaitable<void> {
    RelayServiceConfig rc;
    rc.max_reservations = 1;
    CO_ASSERT_OK(co_await t.setup(rc));
    // A second peer is refused with RESERVATION_REFUSED; B's refresh is still accepted.
    auto c = make_host(t.io);
    CO_ASSERT_OK(co_await c->start());
    RelayClientConfig cc;
    auto cl = RelayClient::start(c, cc);
    c->add_addresses(t.r->local_peer(), t.r->listen_addresses());
    auto refused = co_await cl->reserve(t.r->local_peer(), 5s);
    EXPECT_FALSE(refused);
    if (!refused) {
      EXPECT_NE(refused.error().message().find("RESERVATION_REFUSED"), std::string::npos)
          << refused.error().message();
    }
    CO_ASSERT_OK(co_await t.client->reserve(t.r->local_peer(), 5s));
    EXPECT_EQ(t.service->reservations(), 1u);
    // The reservation ends with B's connection (B's client stopped: it would reserve again).
    co_await t.client->stop();
    t.client.reset();
    t.b->disconnect(t.r->local_peer());
    auto deadline = Clock::now() + 5s;
    while (t.service->reservations() > 0 && Clock::now() < deadline) (void)co_await sleep_for(10ms);
    EXPECT_EQ(t.service->reservations(), 0u);
    co_await cl->stop();
    co_await c->stop();
    co_await t.teardown();
  });
}

TEST(Relay, MalformedAndUnexpectedMessages) {
  Trio t;
  test::run_with_deadline(t.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await t.setup());
    const auto relay = t.r->local_peer();
    t.a->add_addresses(relay, t.r->listen_addresses());
    Bytes garbage{0xff, 0xff, 0xff, 0x01};
    auto m1 = co_await hop_exchange(*t.a, relay, garbage);
    CO_ASSERT_OK(m1);
    EXPECT_EQ(m1.value().status(), pb::MALFORMED_MESSAGE);
    pb::HopMessage st;
    st.set_type(pb::HopMessage::STATUS);
    st.set_status(pb::OK);
    auto st_bytes = encode_message(st);
    auto m2 = co_await hop_exchange(*t.a, relay, st_bytes);
    CO_ASSERT_OK(m2);
    EXPECT_EQ(m2.value().status(), pb::UNEXPECTED_MESSAGE);
    pb::HopMessage conn;  // CONNECT with a peer id that does not parse
    conn.set_type(pb::HopMessage::CONNECT);
    conn.mutable_peer()->set_id("not a peer id");
    auto conn_bytes = encode_message(conn);
    auto m3 = co_await hop_exchange(*t.a, relay, conn_bytes);
    CO_ASSERT_OK(m3);
    EXPECT_EQ(m3.value().status(), pb::MALFORMED_MESSAGE);
    EXPECT_GE(t.service->stats().malformed, 2u);
    // The relay keeps serving.
    auto circuit = t.client->reservations().at(0).addrs.at(0).with_peer_id(t.b->local_peer());
    CO_ASSERT_OK(co_await t.a->connect(circuit));
    co_await t.teardown();
  });
}

TEST(Relay, StopWithoutReservationIsRefused) {
  Trio t;
  test::run_with_deadline(t.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await t.setup());
    // A (no reservation held by B with A) opens /stop to B directly.
    t.a->add_addresses(t.b->local_peer(), t.b->listen_addresses());
    auto s = co_await t.a->open_stream(t.b->local_peer(), kRelayStopProtocol, 5s);
    CO_ASSERT_OK(s);
    pb::StopMessage m;
    m.set_type(pb::StopMessage::CONNECT);
    auto id = t.a->local_peer().bytes();
    m.mutable_peer()->set_id(id.data(), id.size());
    auto m_bytes = encode_message(m);
    CO_ASSERT_OK(co_await write_length_prefixed(*s.value(), m_bytes));
    auto got = co_await read_relay_message(*s.value(), 5s);
    CO_ASSERT_OK(got);
    auto ans = parse_stop(got.value().first);
    CO_ASSERT_OK(ans);
    EXPECT_EQ(ans.value().status(), pb::PERMISSION_DENIED);
    EXPECT_EQ(t.client->refused_stops(), 1u);
    co_await t.teardown();
  });
}

// A relay that lies: it grants B a reservation, then opens /stop claiming the dialer is C
// while it runs the Noise handshake itself. B's Noise check catches it: no connection.
TEST(Relay, LyingRelayCannotImpersonate) {
  asio::io_context io;
  auto liar = make_host(io), b = make_host(io);
  const auto c = PeerId::from_public_key(crypto::KeyPair::generate().public_key());
  liar->set_stream_handler(kRelayHopProtocol, [](ByteStreamPtr s, PeerId) -> awaitable<void> {
    auto got = co_await read_relay_message(*s, 5s);
    if (!got) co_return;
    pb::HopMessage m;
    m.set_type(pb::HopMessage::STATUS);
    m.set_status(pb::OK);
    m.mutable_reservation()->set_expire(static_cast<std::uint64_t>(std::time(nullptr)) + 3600);
    auto bytes = encode_message(m);
    (void)co_await write_length_prefixed(*s, bytes);
    (void)co_await s->close_write();
  });
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await liar->start());
    CO_ASSERT_OK(co_await b->start());
    RelayClientConfig cc;
    cc.relays = {liar->listen_addresses().at(0)};
    auto client = RelayClient::start(b, cc);
    CO_ASSERT_OK(co_await client->wait_reservations(1, 5s));
    auto s = co_await liar->open_stream(b->local_peer(), kRelayStopProtocol, 5s);
    CO_ASSERT_OK(s);
    pb::StopMessage m;
    m.set_type(pb::StopMessage::CONNECT);
    m.mutable_peer()->set_id(c.bytes().data(), c.bytes().size());
    auto m_bytes = encode_message(m);
    CO_ASSERT_OK(co_await write_length_prefixed(*s.value(), m_bytes));
    auto got = co_await read_relay_message(*s.value(), 5s);
    CO_ASSERT_OK(got);
    auto ans = parse_stop(got.value().first);
    CO_ASSERT_OK(ans);
    EXPECT_EQ(ans.value().status(), pb::OK);
    std::vector<std::string> protos{"/noise"};
    auto neg = co_await multistream_select(s.value(), protos, 5s);
    CO_ASSERT_OK(neg);
    auto chan =
        co_await noise_secure_outbound(neg.value().stream, liar->key(), b->local_peer(), 5s);
    // Whether or not the liar's side of the handshake completes, B refuses the connection.
    if (chan) {
      Bytes one{1};
      (void)co_await chan.value().stream->write(one);
      std::array<std::uint8_t, 16> buf;
      auto r = co_await with_timeout(chan.value().stream->read_some(buf), 5s, "read");
      EXPECT_FALSE(r);
    }
    EXPECT_FALSE(b->is_connected(c));
    for (auto& conn : b->connections()) EXPECT_FALSE(conn.relayed);
    co_await client->stop();
    co_await b->stop();
    co_await liar->stop();
  });
}

TEST(Relay, AutonatRefusesOverRelayedConnection) {
  Trio t;
  test::run_with_deadline(t.io, [&]() -> awaitable<void> {
    auto circuit = co_await t.setup();
    CO_ASSERT_OK(circuit);
    AutonatServerConfig sc;
    sc.allow_private = true;
    auto server = AutonatServer::start(t.b, sc);
    CO_ASSERT_OK(co_await t.a->connect(circuit.value()));
    AutonatClientConfig cc;
    cc.servers_per_round = 0;
    auto client = AutonatClient::start(t.a, cc);
    auto ans = co_await client->probe(t.b->local_peer(), 5s);
    CO_ASSERT_OK(ans);
    EXPECT_EQ(ans.value().status, 101) << ans.value().text;
    EXPECT_EQ(client->status(), Reachability::unknown);
    server->stop();
    co_await client->stop();
    co_await t.teardown();
  });
}

// A reservation is refreshed before it expires (at a quarter of the granted time left), on
// the same kept-alive connection.
TEST(Relay, ReservationIsRefreshedBeforeExpiry) {
  Trio t;
  test::run_with_deadline(t.io, [&]() -> awaitable<void> {
    RelayServiceConfig rc;
    rc.reservation_ttl = 4s;
    CO_ASSERT_OK(co_await t.setup(rc));
    const auto first = t.client->reservations().at(0).expire;
    EXPECT_TRUE(t.b->kept_alive(t.r->local_peer()));
    auto deadline = Clock::now() + 10s;
    while (t.service->stats().reservations_accepted < 2 && Clock::now() < deadline)
      (void)co_await sleep_for(50ms);
    EXPECT_GE(t.service->stats().reservations_accepted, 2u);
    EXPECT_GT(t.client->reservations().at(0).expire, first);
    // Still usable after the original expiry.
    auto circuit = t.client->reservations().at(0).addrs.at(0).with_peer_id(t.b->local_peer());
    CO_ASSERT_OK(co_await t.a->connect(circuit));
    co_await t.teardown();
  });
}

// The relay is no single point: when the relay holding our reservation dies, the client
// reserves with the next one, announces that circuit address instead, and is reachable
// through it.
TEST(Relay, SecondRelayTakesOver) {
  asio::io_context io;
  auto r1 = make_host(io), r2 = make_host(io), a = make_host(io), b = make_host(io);
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    // Named lists, not braced temporaries, around co_await (GCC 12).
    std::vector<std::shared_ptr<Host>> all{r1, r2, a, b}, left{r2, a, b};
    for (auto& h : all) CO_ASSERT_OK(co_await h->start());
    install_echo(*b);
    auto s1 = RelayService::start(r1), s2 = RelayService::start(r2);
    RelayClientConfig cc;
    cc.relays = {r1->listen_addresses().at(0), r2->listen_addresses().at(0)};
    cc.want_reservations = 1;
    auto client = RelayClient::start(b, cc);
    CO_ASSERT_OK(co_await client->wait_reservations(1, 5s));
    EXPECT_EQ(client->reservations().at(0).relay, r1->local_peer());
    co_await s1->stop();
    co_await r1->stop();
    auto deadline = Clock::now() + 10s;
    auto on_r2 = [&] {
      auto held = client->reservations();
      return held.size() == 1 && held[0].relay == r2->local_peer();
    };
    while (!on_r2() && Clock::now() < deadline) (void)co_await sleep_for(10ms);
    EXPECT_TRUE(on_r2());
    for (auto& addr : b->announce_addresses())
      if (addr.is_circuit()) {
        auto parts = addr.without_peer_id().circuit_parts();
        EXPECT_TRUE(parts && parts.value().first.peer_id() == r2->local_peer()) << addr.to_string();
      }
    if (on_r2()) {
      auto circuit = client->reservations().at(0).addrs.at(0).with_peer_id(b->local_peer());
      CO_ASSERT_OK(co_await a->connect(circuit));
      Bytes data{1, 2, 3};
      auto echoed = co_await echo(*a, b->local_peer(), data, 5s);
      CO_ASSERT_OK(echoed);
    }
    co_await client->stop();
    co_await s2->stop();
    for (auto& h : left) co_await h->stop();
  });
}

// A relay that goes silent without a reset (its process frozen: here its io thread is
// blocked, so its kernel still accepts and ACKs) is noticed by the client's probe, its
// connection closed, and the second relay takes over, long before yamux keepalive (~40 s).
TEST(Relay, SilentRelayIsReplacedByProbe) {
  IoThread r1_io("relay-r1");
  auto r1 = make_host(r1_io.context());
  auto s1 = block_on(
      r1_io.executor(),
      [r1]() -> awaitable<result<std::shared_ptr<RelayService>>> {
        ST_CO_TRY(co_await r1->start());
        co_return RelayService::start(r1);
      },
      10s);
  ASSERT_TRUE(s1) << s1.error().message();
  const auto r1_addr = r1->listen_addresses().at(0);
  std::promise<void> thaw;
  std::shared_future<void> thawed = thaw.get_future().share();
  asio::io_context io;
  auto r2 = make_host(io), b = make_host(io);
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    std::vector<std::shared_ptr<Host>> hosts{r2, b};
    for (auto& h : hosts) CO_ASSERT_OK(co_await h->start());
    auto s2 = RelayService::start(r2);
    RelayClientConfig cc;
    cc.relays = {r1_addr, r2->listen_addresses().at(0)};
    cc.want_reservations = 1;
    cc.probe_interval = 200ms;
    cc.probe_timeout = 300ms;
    auto client = RelayClient::start(b, cc);
    CO_ASSERT_OK(co_await client->wait_reservations(1, 5s));
    EXPECT_EQ(client->reservations().at(0).relay, r1->local_peer());
    EXPECT_EQ(client->silent_relays(), 0u);                     // a live relay answers its probes
    asio::post(r1_io.executor(), [thawed] { thawed.wait(); });  // R1 goes silent
    const auto t0 = Clock::now();
    auto on_r2 = [&] {
      auto held = client->reservations();
      return held.size() == 1 && held[0].relay == r2->local_peer();
    };
    while (!on_r2() && Clock::now() - t0 < 10s) (void)co_await sleep_for(10ms);
    EXPECT_TRUE(on_r2());
    EXPECT_GE(client->silent_relays(), 1u);
    EXPECT_LT(Clock::now() - t0, 5s);
    thaw.set_value();
    co_await client->stop();
    co_await s2->stop();
    for (auto& h : hosts) co_await h->stop();
  });
  if (thawed.wait_for(0s) != std::future_status::ready) thaw.set_value();
  auto stopped = block_on(
      r1_io.executor(),
      [r1, s = s1.value()]() -> awaitable<result<void>> {
        co_await s->stop();
        co_await r1->stop();
        co_return success();
      },
      10s);
  EXPECT_TRUE(stopped);
}

// DCUtR's last step on loopback: A (dialed through the relay) dials B's listening port from
// its own listening port and upgrades as the client; the direct connection then carries new
// streams while the relayed one stays open as the fallback.
TEST(Relay, PunchedDirectConnectionPreferredOverRelay) {
  Trio t;
  test::run_with_deadline(t.io, [&]() -> awaitable<void> {
    auto circuit = co_await t.setup();
    CO_ASSERT_OK(circuit);
    const auto bid = t.b->local_peer();
    CO_ASSERT_OK(co_await t.a->connect(circuit.value()));
    // Without HostConfig::hole_punching (the default) the host refuses to punch.
    auto plain = Host::create(t.io.get_executor(), crypto::KeyPair::generate());
    auto refused = co_await plain->dial_punched(t.b->listen_addresses().at(0), bid, true, 1s);
    EXPECT_TRUE(!refused && refused.error() == errc::unsupported);
    auto punched = co_await t.a->dial_punched(t.b->listen_addresses().at(0), bid,
                                              /*as_client=*/true, 5s);
    CO_ASSERT_OK(punched);
    auto data = random_bytes(10 * 1024);
    auto echoed = co_await echo(*t.a, bid, data, 10s);
    CO_ASSERT_OK(echoed);
    EXPECT_TRUE(echoed.value() == data);
    int direct = 0, relayed = 0;
    for (const auto& c : t.a->connections()) {
      if (c.peer != bid) continue;
      ++(c.relayed ? relayed : direct);
      if (!c.relayed) {
        EXPECT_TRUE(c.outbound);
        auto got = c.remote_addr.without_peer_id().to_tcp_endpoint();
        auto want = t.b->listen_addresses().at(0).to_tcp_endpoint();
        EXPECT_TRUE(got && want && got.value().port() == want.value().port())
            << c.remote_addr.to_string() << " vs " << t.b->listen_addresses().at(0).to_string();
      }
    }
    EXPECT_EQ(direct, 1);
    EXPECT_EQ(relayed, 1);  // kept as the fallback
    co_await t.teardown();
  });
}
