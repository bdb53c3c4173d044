// Multi-node tests of the Host over real loopback sockets (port 0), in one process.
#include <gtest/gtest.h>

#include <sodium.h>
#include <asio/experimental/awaitable_operators.hpp>

#include <future>
#include <thread>

#include "starling/core/blocking.hpp"
#include "starling/core/log.hpp"
#include "starling/net/echo.hpp"
#include "starling/net/host.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

namespace {
std::shared_ptr<Host> make_host(asio::io_context& io, HostConfig cfg = {}) {
  return Host::create(io.get_executor(), crypto::KeyPair::generate(), cfg);
}

Bytes random_bytes(std::size_t n) {
  Bytes b(n);
  randombytes_buf(b.data(), b.size());
  return b;
}
}  // namespace

TEST(Host, ConnectIdentifyPingEcho) {
  asio::io_context io;
  auto a = make_host(io), b = make_host(io);
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await a->start());
    CO_ASSERT_OK(co_await b->start());
    install_echo(*b);
    auto addr = b->listen_addresses().at(0);
    EXPECT_EQ(addr.peer_id(), b->local_peer());
    auto peer = co_await a->connect(addr);
    CO_ASSERT_OK(peer);
    EXPECT_EQ(peer.value(), b->local_peer());
    auto info = co_await a->wait_identified(b->local_peer(), 5s);
    CO_ASSERT_OK(info);
    EXPECT_EQ(info.value().agent_version, "starling/0.1.0");
    EXPECT_NE(
        std::find(info.value().protocols.begin(), info.value().protocols.end(), kEchoProtocol),
        info.value().protocols.end());
    auto back_info = co_await b->wait_identified(a->local_peer(), 5s);
    CO_ASSERT_OK(back_info);
    auto rtts = co_await ping(*a, b->local_peer(), 3, 5s);
    CO_ASSERT_OK(rtts);
    EXPECT_EQ(rtts.value().size(), 3u);
    auto data = random_bytes(3 << 20);
    auto echoed = co_await echo(*a, b->local_peer(), data, 10s);
    CO_ASSERT_OK(echoed);
    EXPECT_TRUE(echoed.value() == data);
    // One connection, reused.
    EXPECT_EQ(a->connections().size(), 1u);
    co_await a->stop();
    co_await b->stop();
  });
}

TEST(Host, ConcurrentStreamsAndDialsShareOneConnection) {
  asio::io_context io;
  auto a = make_host(io), b = make_host(io);
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await a->start());
    CO_ASSERT_OK(co_await b->start());
    install_echo(*b);
    a->add_addresses(b->local_peer(), b->listen_addresses());
    auto ex = co_await asio::this_coro::executor;
    TaskScope scope(ex);
    AsyncEvent done(ex);
    int finished = 0, ok = 0;
    constexpr int kStreams = 16;
    for (int i = 0; i < kStreams; ++i)
      scope.spawn([&]() -> awaitable<void> {
        auto data = random_bytes(256 * 1024);
        auto r = co_await echo(*a, b->local_peer(), data, 20s);
        if (r && r.value() == data) {
          ++ok;
        } else if (!r) {
          ADD_FAILURE() << r.error().message();
        }
        if (++finished == kStreams) done.set();
      });
    CO_ASSERT_OK(co_await with_timeout(done.wait(), 30s, "streams"));
    EXPECT_EQ(ok, kStreams);
    EXPECT_EQ(a->connections().size(), 1u);
    co_await a->stop();
    co_await b->stop();
  });
}

TEST(Host, DialErrorsNameThePeerAddressAndCause) {
  asio::io_context io;
  auto a = make_host(io), b = make_host(io);
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await a->start());
    CO_ASSERT_OK(co_await b->start());
    auto addr = b->listen_addresses().at(0);
    co_await b->stop();  // nobody listens there any more
    auto r = co_await a->connect(addr, 5s);
    CO_ASSERT_FALSE(r);
    auto msg = r.error().message();
    EXPECT_NE(msg.find(b->local_peer().to_string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(addr.without_peer_id().to_string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("refused"), std::string::npos) << msg;
    // Wrong peer id at a live address: the Noise handshake rejects it.
    auto c = make_host(io);
    CO_ASSERT_OK(co_await c->start());
    a->add_addresses(c->local_peer(), c->listen_addresses());
    auto wrong = c->listen_addresses().at(0).with_peer_id(b->local_peer());
    auto w = co_await a->connect(wrong, 5s);
    CO_ASSERT_FALSE(w);
    EXPECT_FALSE(a->is_connected(c->local_peer()));
    EXPECT_FALSE(a->is_connected(b->local_peer()));
    // Unknown protocol: a clear error on the (lazily negotiated) stream's first read, the
    // connection survives.
    auto u = co_await a->open_stream(c->local_peer(), "/nope/1.0.0", 5s);
    CO_ASSERT_OK(u);
    CO_ASSERT_OK(co_await u.value()->write(as_bytes("request")));
    Bytes buf(16);
    auto ur = co_await with_timeout(u.value()->read_some(buf), 5s, "read from refused stream");
    CO_ASSERT_FALSE(ur);
    EXPECT_EQ(ur.error(), errc::unsupported) << ur.error().message();
    EXPECT_NE(ur.error().message().find("/nope/1.0.0"), std::string::npos) << ur.error().message();
    EXPECT_TRUE(a->is_connected(c->local_peer()));
    co_await a->stop();
    co_await c->stop();
  });
}

TEST(Host, PeerDeathSurfacesWithinDeadlineAndStopIsBounded) {
  asio::io_context io;
  auto a = make_host(io), b = make_host(io);
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await a->start());
    CO_ASSERT_OK(co_await b->start());
    // b's handler reads forever (never answers); a's read must fail when b dies.
    b->set_stream_handler("/hang/1.0.0", [](ByteStreamPtr s, PeerId) -> awaitable<void> {
      Bytes buf(1024);
      for (;;) {
        auto n = co_await s->read_some(buf);
        if (!n) co_return;
      }
    });
    CO_ASSERT_OK(co_await a->connect(b->listen_addresses().at(0)));
    auto s = co_await a->open_stream(b->local_peer(), "/hang/1.0.0", 5s);
    CO_ASSERT_OK(s);
    CO_ASSERT_OK(co_await s.value()->write(as_bytes("x")));
    auto t0 = Clock::now();
    co_await b->stop();  // b goes away with the stream in flight
    EXPECT_LT(Clock::now() - t0, 6s);
    Bytes buf(16);
    auto r = co_await with_timeout(s.value()->read_some(buf), 10s, "read after peer death");
    CO_ASSERT_FALSE(r);
    EXPECT_NE(r.error(), errc::timeout) << r.error().message();
    EXPECT_LT(Clock::now() - t0, 8s);
    auto t1 = Clock::now();
    co_await a->stop();
    EXPECT_LT(Clock::now() - t1, 6s);
  });
}

TEST(Host, GarbageFromAPeerOnlyCostsThatConnection) {
  asio::io_context io;
  // Random junk may start with a varint announcing a long multistream message, so the host can
  // only give up at its handshake deadline: keep that short and the client's own wait far longer,
  // so a timeout seen by the client means the host really hung.
  HostConfig cfg;
  cfg.dial_timeout = 2s;
  auto a = make_host(io, cfg), b = make_host(io);
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await a->start());
    CO_ASSERT_OK(co_await b->start());
    install_echo(*a);
    auto ep = a->listen_addresses().at(0).to_tcp_endpoint().value();
    // A raw TCP client that sends garbage instead of multistream-select.
    for (int i = 0; i < 3; ++i) {
      auto raw = co_await net::tcp_connect(ep, 5s);
      CO_ASSERT_OK(raw);
      Bytes junk = random_bytes(200);
      // The first client always announces a long message and never finishes it: the host can
      // only drop it at its handshake deadline.
      if (i == 0) junk[0] = 0xf4, junk[1] = 0x03;  // varint 500
      (void)co_await raw.value()->write(junk);
      Bytes buf(64);
      auto r = co_await with_timeout(raw.value()->read_some(buf), 20s, "garbage peer");
      // Whatever came back, the host must close on us (no hang).
      while (r) r = co_await with_timeout(raw.value()->read_some(buf), 20s, "garbage peer");
      EXPECT_NE(r.error(), errc::timeout);
    }
    // The host still serves a well-behaved peer.
    CO_ASSERT_OK(co_await b->connect(a->listen_addresses().at(0)));
    auto e = co_await echo(*b, a->local_peer(), as_bytes("still here"), 5s);
    CO_ASSERT_OK(e);
    EXPECT_EQ(as_string(e.value()), "still here");
    EXPECT_GE(a->stats().failed_handshakes, 3u);
    co_await a->stop();
    co_await b->stop();
  });
}

// Lazy select saves the negotiation round trip: with the peer's io thread frozen (it cannot
// answer anything), open_stream() returns and the request is written; a host negotiating
// strictly cannot even open the stream. Once the peer thaws, the request is answered.
TEST(Host, LazyStreamCarriesItsRequestBeforeThePeerCanAnswer) {
  asio::io_context io, io_b;
  auto a = make_host(io);
  HostConfig strict_cfg;
  strict_cfg.lazy_select = false;
  auto strict = make_host(io, strict_cfg);
  auto b = make_host(io_b);
  install_echo(*b);
  auto work = asio::make_work_guard(io_b);
  std::thread tb([&] { io_b.run(); });
  ASSERT_TRUE(block_on(
      io_b.get_executor(), [&] { return b->start(); }, 10s));
  std::promise<void> frozen;
  struct Thaw {  // b's thread is released whatever happens to the test
    std::promise<void> p;
    bool done = false;
    void operator()() {
      if (!done) p.set_value();
      done = true;
    }
    ~Thaw() { (*this)(); }
  } thaw;
  auto thawed = thaw.p.get_future().share();
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await a->start());
    CO_ASSERT_OK(co_await strict->start());
    CO_ASSERT_OK(co_await a->connect(b->listen_addresses().at(0)));
    CO_ASSERT_OK(co_await strict->connect(b->listen_addresses().at(0)));
    CO_ASSERT_OK(co_await a->wait_identified(b->local_peer(), 10s));
    CO_ASSERT_OK(co_await strict->wait_identified(b->local_peer(), 10s));
    asio::post(io_b, [&frozen, thawed] {
      frozen.set_value();
      thawed.wait();
    });
    frozen.get_future().wait();  // b's thread now answers nothing
    auto s = co_await a->open_stream(b->local_peer(), kEchoProtocol, 5s);
    CO_ASSERT_OK(s);
    CO_ASSERT_OK(co_await s.value()->write(as_bytes("ping")));
    auto t = co_await strict->open_stream(b->local_peer(), kEchoProtocol, 300ms);
    CO_ASSERT_FALSE(t);
    EXPECT_EQ(t.error(), errc::timeout) << t.error().message();
    thaw();
    std::array<std::uint8_t, 4> buf{};
    CO_ASSERT_OK(co_await with_timeout(read_exact(*s.value(), buf), 10s, "echo"));
    EXPECT_EQ(as_string(buf), "ping");
    co_await a->stop();
    co_await strict->stop();
  });
  thaw();
  (void)block_on(
      io_b.get_executor(),
      [&]() -> awaitable<result<void>> {
        co_await b->stop();
        co_return success();
      },
      10s);
  work.reset();
  io_b.stop();
  tb.join();
}

// Idle connections: the dialer closes the ones it does not keep alive; keep_alive() and the
// listener's side (inbound connections are left to their dialer) keep the others open.
TEST(Host, IdleTimeoutSparesKeptAliveAndInboundConnections) {
  asio::io_context io;
  HostConfig cfg;
  cfg.idle_timeout = 200ms;
  auto a = make_host(io, cfg), b = make_host(io, cfg), c = make_host(io, cfg);
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await a->start());
    CO_ASSERT_OK(co_await b->start());
    CO_ASSERT_OK(co_await c->start());
    a->keep_alive(c->local_peer(), true);
    EXPECT_TRUE(a->kept_alive(c->local_peer()));
    CO_ASSERT_OK(co_await a->connect(c->listen_addresses().at(0)));
    CO_ASSERT_OK(co_await a->connect(b->listen_addresses().at(0)));
    CO_ASSERT_OK(co_await a->wait_identified(c->local_peer(), 5s));
    CO_ASSERT_OK(co_await a->wait_identified(b->local_peer(), 5s));
    auto t0 = Clock::now();
    while (a->is_connected(b->local_peer()) && Clock::now() - t0 < 20s)
      (void)co_await sleep_for(20ms);
    EXPECT_FALSE(a->is_connected(b->local_peer())) << "idle outbound connection not closed";
    // The kept connection was idle as long (it became idle first), and c as the listener
    // never closes it: both ends still have it several idle periods later.
    (void)co_await sleep_for(5 * cfg.idle_timeout);
    EXPECT_TRUE(a->is_connected(c->local_peer()));
    EXPECT_TRUE(c->is_connected(a->local_peer()));
    // Kept alive no more: now it idles out too.
    a->keep_alive(c->local_peer(), false);
    t0 = Clock::now();
    while (a->is_connected(c->local_peer()) && Clock::now() - t0 < 20s)
      (void)co_await sleep_for(20ms);
    EXPECT_FALSE(a->is_connected(c->local_peer()));
    co_await a->stop();
    co_await b->stop();
    co_await c->stop();
  });
}
