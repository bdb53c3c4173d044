// DCUtR in the host over loopback through a real circuit relay: the automatic upgrade of a
// relayed connection to a direct one (both roles), the peer's SYN reaching A's listener (A
// must still be the client), and failures that leave the relayed connection working.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <sodium.h>

#include "starling/net/byte_stream.hpp"
#include "starling/net/dcutr.hpp"
#include "starling/net/echo.hpp"
#include "starling/net/host.hpp"
#include "starling/net/relay.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

namespace {
constexpr const char* kWhich = "/test/which-connection/1";

HostConfig punching_config(bool allow_private, std::string listen = "/ip4/127.0.0.1/tcp/0") {
  HostConfig cfg;
  cfg.listen = {std::move(listen)};
  cfg.hole_punching = true;
  cfg.dcutr.allow_private = allow_private;  // loopback addresses are not public
  cfg.dcutr.message_timeout = 3s;
  cfg.dcutr.dial_timeout = 2s;
  return cfg;
}

// Answers "relayed" or "direct": the kind of connection the stream arrived on.
void install_which(Host& h) {
  h.set_stream_handler(kWhich, [&h](ByteStreamPtr s, PeerId) -> awaitable<void> {
    auto c = h.stream_connection(s.get());
    std::string kind = !c ? "none" : c->relayed ? "relayed" : "direct";
    Bytes b(kind.begin(), kind.end());
    if (co_await s->write(b)) (void)co_await s->close_write();
  });
}

awaitable<result<std::string>> which(Host& from, const PeerId& to) {
  ST_CO_TRY(auto s, co_await from.open_stream(to, kWhich, 5s));
  std::string out;
  std::array<std::uint8_t, 64> buf;
  for (;;) {
    auto n = co_await with_timeout(s->read_some(buf), 5s, "which");
    if (!n && n.error() == errc::closed) break;
    ST_CO_TRY(auto got, std::move(n));
    out.append(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(got));
  }
  co_return out;
}

struct Counts {
  int direct = 0, relayed = 0;
  bool direct_outbound = false;
};
Counts count(const Host& h, const PeerId& peer) {
  Counts c;
  for (const auto& ci : h.connections()) {
    if (ci.peer != peer) continue;
    if (ci.relayed) {
      ++c.relayed;
    } else {
      ++c.direct;
      c.direct_outbound = ci.outbound;
    }
  }
  return c;
}

// Polls `pred` every few milliseconds until it holds or `timeout` passes.
template <class Pred>
awaitable<bool> eventually(Pred pred, Duration timeout) {
  auto deadline = Clock::now() + timeout;
  while (!pred()) {
    if (Clock::now() >= deadline) co_return false;
    (void)co_await sleep_for(5ms);
  }
  co_return true;
}

// A relay R, a peer B holding a reservation with R, a peer A that dials B through R.
struct Lab {
  asio::io_context io;
  std::shared_ptr<Host> r, a, b;
  std::shared_ptr<RelayService> service;
  std::shared_ptr<RelayClient> client;
  Lab(HostConfig acfg, HostConfig bcfg)
      : r(Host::create(io.get_executor(), crypto::KeyPair::generate())),
        a(Host::create(io.get_executor(), crypto::KeyPair::generate(), std::move(acfg))),
        b(Host::create(io.get_executor(), crypto::KeyPair::generate(), std::move(bcfg))) {}

  // Starts everything, connects A to B through the relay; returns B's circuit address.
  awaitable<result<Multiaddr>> setup() {
    ST_CO_TRY(co_await r->start());
    ST_CO_TRY(co_await a->start());
    ST_CO_TRY(co_await b->start());
    for (auto* h : {a.get(), b.get()}) {
      install_echo(*h);
      install_which(*h);
    }
    service = RelayService::start(r);
    RelayClientConfig cc;
    cc.relays = {r->listen_addresses().at(0)};
    client = RelayClient::start(b, cc);
    ST_CO_TRY(co_await client->wait_reservations(1, 10s));
    auto circuit = client->reservations().at(0).addrs.at(0).with_peer_id(b->local_peer());
    // A knows R directly (its observed address comes from there).
    ST_CO_TRY(co_await a->connect(r->listen_addresses().at(0)));
    ST_CO_TRY(co_await a->connect(circuit));
    // B's side of the relayed connection is registered once its upgrade ends.
    if (!co_await eventually([&] { return b->is_connected(a->local_peer()); }, 5s))
      co_return make_error(errc::timeout, "B never saw the relayed connection");
    co_return circuit;
  }
  awaitable<void> teardown() {
    if (client) co_await client->stop();
    if (service) co_await service->stop();
    co_await a->stop();
    co_await b->stop();
    co_await r->stop();
  }
};

awaitable<result<HolePunchMsg>> read_punch(BufferedReader& in) {
  ST_CO_TRY(auto body,
            co_await with_timeout(in.read_length_prefixed(kMaxHolePunchMessage), 5s, "dcutr read"));
  co_return parse_hole_punch(body);
}

// (Named locals, never braced temporaries, inside co_await: the GCC 12 bug.)
awaitable<result<void>> send_punch(ByteStream& s, HolePunchMsg::Type type,
                                   const std::vector<Multiaddr>& addrs) {
  HolePunchMsg m;
  m.type = type;
  m.addrs = addrs;
  auto frame = frame_hole_punch(m);
  co_return co_await s.write(frame);
}

std::uint16_t closed_port(asio::io_context& io) {
  asio::ip::tcp::acceptor acc(io, {asio::ip::make_address("127.0.0.1"), 0});
  return acc.local_endpoint().port();  // closed again when acc goes
}
}  // namespace

TEST(DcutrHost, UpgradesRelayedConnectionToDirect) {
  Lab lab(punching_config(true), punching_config(true));
  test::run_with_deadline(lab.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await lab.setup());
    const auto aid = lab.a->local_peer(), bid = lab.b->local_peer();
    // B accepted the relayed connection: it starts DCUtR at once, A answers.
    CO_ASSERT_TRUE(co_await eventually(
        [&] {
          return lab.a->stats().dcutr_succeeded + lab.a->stats().dcutr_failed > 0 &&
                 lab.b->stats().dcutr_succeeded + lab.b->stats().dcutr_failed > 0;
        },
        15s));
    EXPECT_EQ(lab.b->stats().dcutr_succeeded, 1u);
    EXPECT_EQ(lab.a->stats().dcutr_succeeded, 1u);
    EXPECT_GE(lab.a->stats().punched_connections + lab.b->stats().punched_connections, 1u);
    // One direct connection (A is its client) beside the relayed one, kept as the fallback.
    auto ca = count(*lab.a, bid), cb = count(*lab.b, aid);
    EXPECT_EQ(ca.direct, 1);
    EXPECT_EQ(ca.relayed, 1);
    EXPECT_TRUE(ca.direct_outbound);
    EXPECT_EQ(cb.direct, 1);
    EXPECT_EQ(cb.relayed, 1);
    EXPECT_FALSE(cb.direct_outbound);
    // New streams, either way, use the direct connection.
    auto wa = co_await which(*lab.a, bid);
    CO_ASSERT_OK(wa);
    EXPECT_EQ(wa.value(), "direct");
    auto wb = co_await which(*lab.b, aid);
    CO_ASSERT_OK(wb);
    EXPECT_EQ(wb.value(), "direct");
    Bytes data(300 * 1024);  // more than the relay's 128 KiB circuit cap
    randombytes_buf(data.data(), data.size());
    auto echoed = co_await echo(*lab.a, bid, data, 10s);
    CO_ASSERT_OK(echoed);
    EXPECT_TRUE(echoed.value() == data);
    co_await lab.teardown();
  });
}

// B starts DCUtR as soon as the relayed connection is up, not after identify (whose
// negotiation and answer cost two relayed RTTs): here A refuses B's identify requests (B's
// identify of A never completes), and the upgrade still happens.
TEST(DcutrHost, StartsWithoutWaitingForIdentify) {
  Lab lab(punching_config(true), punching_config(true));
  test::run_with_deadline(lab.io, [&]() -> awaitable<void> {
    lab.a->remove_stream_handler(kIdentifyProtocol);
    CO_ASSERT_OK(co_await lab.setup());
    const auto bid = lab.b->local_peer();
    CO_ASSERT_TRUE(co_await eventually(
        [&] { return lab.b->stats().dcutr_succeeded + lab.b->stats().dcutr_failed > 0; }, 15s));
    EXPECT_EQ(lab.b->stats().dcutr_succeeded, 1u);
    EXPECT_EQ(count(*lab.a, bid).direct, 1);
    auto wa = co_await which(*lab.a, bid);
    CO_ASSERT_OK(wa);
    EXPECT_EQ(wa.value(), "direct");
    co_await lab.teardown();
  });
}

// B is scripted here: its SYN reaches A's listener after the CONNECTs and before SYNC, while
// A is not dialing yet. A must upgrade that accepted connection as the client (multistream
// dialer, Noise initiator, yamux client), not as a listener, or both sides wait as servers.
TEST(DcutrHost, PeerSynOnListenerTakesAgreedRole) {
  Lab lab(punching_config(true), punching_config(false));  // B does not start DCUtR itself
  test::run_with_deadline(lab.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await lab.setup());
    const auto aid = lab.a->local_peer(), bid = lab.b->local_peer();
    auto s = co_await lab.b->open_stream(aid, std::string(kDcutrProtocol), 5s);
    CO_ASSERT_OK(s);
    BufferedReader in(*s.value());
    const std::vector<Multiaddr> baddr{lab.b->listen_addresses().at(0).without_peer_id()}, none;
    CO_ASSERT_OK(co_await send_punch(*s.value(), HolePunchMsg::Type::connect, baddr));
    auto theirs = co_await read_punch(in);
    CO_ASSERT_OK(theirs);
    EXPECT_EQ(theirs.value().type, HolePunchMsg::Type::connect);
    auto aaddr = lab.a->listen_addresses().at(0);
    EXPECT_NE(std::find(theirs.value().addrs.begin(), theirs.value().addrs.end(),
                        aaddr.without_peer_id()),
              theirs.value().addrs.end());
    // B's punch dial, as the server, lands on A's listener.
    auto punched = co_await lab.b->dial_punched(aaddr, aid, /*as_client=*/false, 5s);
    CO_ASSERT_OK(punched);
    auto ca = count(*lab.a, bid);
    EXPECT_EQ(ca.direct, 1);
    EXPECT_TRUE(ca.direct_outbound);  // A took the client role on the accepted connection
    EXPECT_EQ(lab.a->stats().punched_connections, 1u);
    // SYNC: A's own dial meets the connection that exists and the punch counts as done.
    CO_ASSERT_OK(co_await send_punch(*s.value(), HolePunchMsg::Type::sync, none));
    CO_ASSERT_TRUE(co_await eventually([&] { return lab.a->stats().dcutr_succeeded == 1; }, 5s));
    EXPECT_EQ(count(*lab.a, bid).direct, 1);
    auto w = co_await which(*lab.a, bid);
    CO_ASSERT_OK(w);
    EXPECT_EQ(w.value(), "direct");
    co_await lab.teardown();
  });
}

// A scripted B offers an address nobody listens on, then sends garbage: A's dial fails, the
// stream is closed with a logged reason, and the relayed connection carries on.
TEST(DcutrHost, FailedPunchAndMalformedMessageKeepRelayedConnection) {
  Lab lab(punching_config(true), punching_config(false));
  test::run_with_deadline(lab.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await lab.setup());
    const auto aid = lab.a->local_peer(), bid = lab.b->local_peer();
    auto s = co_await lab.b->open_stream(aid, std::string(kDcutrProtocol), 5s);
    CO_ASSERT_OK(s);
    BufferedReader in(*s.value());
    const std::vector<Multiaddr> nowhere{
        Multiaddr::parse(fmt::format("/ip4/127.0.0.1/tcp/{}", closed_port(lab.io))).value()},
        none;
    CO_ASSERT_OK(co_await send_punch(*s.value(), HolePunchMsg::Type::connect, nowhere));
    CO_ASSERT_OK(co_await read_punch(in));
    const auto t0 = Clock::now();
    CO_ASSERT_OK(co_await send_punch(*s.value(), HolePunchMsg::Type::sync, none));
    // A's dial is refused at once; A then waits for the next attempt's CONNECT: garbage.
    Bytes junk(6, 0xff);  // length 5, then a field key and a varint that never ends
    junk[0] = 0x05;
    junk[1] = 0x08;
    CO_ASSERT_OK(co_await s.value()->write(junk));
    CO_ASSERT_TRUE(co_await eventually([&] { return lab.a->stats().dcutr_failed == 1; }, 5s));
    EXPECT_LT(Clock::now() - t0, 4s);  // the dial failure did not wait for dial_timeout
    EXPECT_EQ(lab.a->stats().dcutr_succeeded, 0u);
    auto ca = count(*lab.a, bid);
    EXPECT_EQ(ca.direct, 0);
    EXPECT_EQ(ca.relayed, 1);
    auto w = co_await which(*lab.a, bid);
    CO_ASSERT_OK(w);
    EXPECT_EQ(w.value(), "relayed");
    co_await lab.teardown();
  });
}

// Both sides run DCUtR but no dial can work (A listens on IPv6 only, B on IPv4 only): B gives
// up after its attempts within the configured bounds and both keep the relayed connection.
TEST(DcutrHost, UnpunchableFallsBackToRelay) {
  auto acfg = punching_config(true, "/ip6/::1/tcp/0");
  auto bcfg = punching_config(true);
  bcfg.dcutr.max_attempts = 2;
  Lab lab(acfg, bcfg);
  test::run_with_deadline(lab.io, [&]() -> awaitable<void> {
    auto t0 = Clock::now();
    CO_ASSERT_OK(co_await lab.setup());
    const auto aid = lab.a->local_peer(), bid = lab.b->local_peer();
    CO_ASSERT_TRUE(co_await eventually(
        [&] { return lab.a->stats().dcutr_failed == 1 && lab.b->stats().dcutr_failed == 1; }, 20s));
    // Two attempts, each bounded by message_timeout + dial_timeout.
    EXPECT_LT(Clock::now() - t0, 2 * (3s + 2s));
    EXPECT_EQ(lab.a->stats().dcutr_succeeded + lab.b->stats().dcutr_succeeded, 0u);
    EXPECT_EQ(count(*lab.a, bid).relayed, 1);
    EXPECT_EQ(count(*lab.b, aid).direct, 0);
    auto w = co_await which(*lab.b, aid);
    CO_ASSERT_OK(w);
    EXPECT_EQ(w.value(), "relayed");
    co_await lab.teardown();
  });
}
