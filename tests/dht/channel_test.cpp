// Request channels (`/starling/dht/1.1.0`, channel.hpp): the frame codec, nodes that use them,
// the fallback to one RPC call per request, and misbehaving peers on either end.
#include <gtest/gtest.h>

#include "node_cluster.hpp"
#include "starling/dht/channel.hpp"
#include "starling/dht/messages.hpp"
#include "starling/net/rpc_detail.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::dht;
using starling::dht::test::NodeCluster;
using starling::dht::test::quick_config;

namespace {

constexpr Duration kTestDeadline = 90s;

void run_cluster_test(std::function<awaitable<void>(NodeCluster&)> body) {
  asio::io_context io;
  starling::test::run_with_deadline(
      io,
      [&]() -> awaitable<void> {
        NodeCluster c(co_await asio::this_coro::executor);
        co_await body(c);
        co_await c.stop_all();
      },
      kTestDeadline);
}

Bytes ping_request() {
  Request r;
  r.body = PingRequest{};
  return encode(r);
}

// The next frame on `s` (std::nullopt if the stream ended or was reset).
awaitable<std::optional<Bytes>> next_frame(net::BufferedReader& r) {
  auto len = co_await net::detail::read_frame_length(r);
  if (!len || !len.value()) co_return std::nullopt;
  auto body = co_await net::detail::read_frame_body(r, static_cast<std::size_t>(*len.value()));
  if (!body) co_return std::nullopt;
  co_return std::move(body).value();
}

// A bare host that dials `node` (no DHT of its own).
awaitable<result<std::shared_ptr<net::Host>>> raw_host(NodeCluster& c, std::size_t node) {
  net::HostConfig hc;
  auto h = net::Host::create(co_await asio::this_coro::executor, crypto::KeyPair::generate(), hc);
  ST_CO_TRY(co_await h->start());
  std::vector<net::Multiaddr> addrs{c.addr(node)};
  h->add_addresses(c.node(node).peer(), addrs);
  co_return h;
}

}  // namespace

TEST(ChannelWire, RoundTripAndMalformedBodies) {
  const Bytes msg = ping_request();
  const Bytes frame = encode_channel_frame(300, msg);
  auto len = decode_uvarint(frame);
  ASSERT_TRUE(len && len.value());
  EXPECT_EQ(len.value()->value + len.value()->length, frame.size());
  auto f = decode_channel_frame(BytesView(frame).subspan(len.value()->length));
  ASSERT_TRUE(f) << f.error().message();
  EXPECT_EQ(f.value().id, 300u);
  EXPECT_EQ(Bytes(f.value().message.begin(), f.value().message.end()), msg);
  EXPECT_FALSE(decode_channel_frame(Bytes{}));            // no id
  EXPECT_FALSE(decode_channel_frame(Bytes{0x80}));        // id cut short
  EXPECT_FALSE(decode_channel_frame(Bytes{0x80, 0x00}));  // non-minimal id
  EXPECT_FALSE(decode_channel_frame(Bytes{0x05}));        // id without a message
}

TEST(DhtChannel, RequestsTravelOnChannels) {
  run_cluster_test([](NodeCluster& c) -> awaitable<void> {
    CO_ASSERT_OK(co_await c.add_many(8));
    const auto key = RecordKey::from_string("channel-key");
    CO_ASSERT_OK(co_await c.node(2).store(key, to_bytes("v"), Millis(60'000)));
    for (std::size_t i = 0; i < 8; ++i) {
      auto g = co_await c.node(i).get(key);
      CO_ASSERT_OK(g);
      CO_ASSERT_TRUE(g.value() && g.value()->plain);
      EXPECT_EQ(g.value()->plain->value, to_bytes("v"));
    }
    std::uint64_t served = 0;
    for (std::size_t i = 0; i < 8; ++i) {
      const auto s = c.node(i).channel_stats();
      EXPECT_GT(s.sent, 0u) << i;
      EXPECT_EQ(s.rpc_sent, 0u) << i;  // every peer serves channels
      EXPECT_EQ(s.fallback, 0u) << i;
      EXPECT_EQ(c.node(i).bad_messages(), 0u) << i;
      served += s.served;
    }
    EXPECT_GT(served, 0u);
  });
}

TEST(DhtChannel, PeersWithoutChannelsGetRpcCalls) {
  run_cluster_test([](NodeCluster& c) -> awaitable<void> {
    auto old = quick_config();
    old.serve_channels = false;  // an older node: /starling/dht/1.0.0 only
    old.use_channels = false;
    CO_ASSERT_OK(co_await c.add(old));
    CO_ASSERT_OK(co_await c.add_many(4));
    const auto key = RecordKey::from_string("mixed-key");
    CO_ASSERT_OK(co_await c.node(3).store(key, to_bytes("v"), Millis(60'000)));
    for (std::size_t i = 0; i < 5; ++i) {
      auto g = co_await c.node(i).get(key);
      CO_ASSERT_OK(g);
      CO_ASSERT_TRUE(g.value() && g.value()->plain);
    }
    EXPECT_EQ(c.node(0).channel_stats().sent, 0u);
    EXPECT_GT(c.node(0).channel_stats().rpc_sent, 0u);
    std::uint64_t fallback = 0;
    for (std::size_t i = 1; i < 5; ++i) {
      fallback += c.node(i).channel_stats().fallback;
      EXPECT_EQ(c.node(i).bad_messages(), 0u);
    }
    EXPECT_GE(fallback, 1u);  // node 0 answered "na" and was then asked by RPC
  });
}

TEST(DhtChannel, BadFramesCloseTheStreamWithAReason) {
  run_cluster_test([](NodeCluster& c) -> awaitable<void> {
    CO_ASSERT_OK(co_await c.add_many(1));
    auto h = co_await raw_host(c, 0);
    CO_ASSERT_OK(h);
    auto open = [&]() { return h.value()->open_stream(c.node(0).peer(), kDhtChannelProtocol, 5s); };
    // A well-formed request is answered under its id; then garbage closes the stream.
    auto s = co_await open();
    CO_ASSERT_OK(s);
    net::BufferedReader r(*s.value());
    CO_ASSERT_OK(co_await s.value()->write(encode_channel_frame(7, ping_request())));
    auto answer = co_await next_frame(r);
    CO_ASSERT_TRUE(answer);
    auto f = decode_channel_frame(*answer);
    CO_ASSERT_OK(f);
    EXPECT_EQ(f.value().id, 7u);
    auto resp = decode_response(f.value().message);
    CO_ASSERT_OK(resp);
    EXPECT_TRUE(std::holds_alternative<PingResponse>(resp.value().body));
    const Bytes junk = encode_channel_frame(8, to_bytes("\xff\xff junk"));
    CO_ASSERT_OK(co_await s.value()->write(junk));
    EXPECT_FALSE(co_await next_frame(r));
    EXPECT_EQ(c.node(0).bad_messages(), 1u);
    // A frame announcing more than the limit.
    auto s2 = co_await open();
    CO_ASSERT_OK(s2);
    Bytes big;
    append_uvarint(big, channel_frame_limit(c.node(0).config().dht.limits.max_message_bytes) + 1);
    CO_ASSERT_OK(co_await s2.value()->write(big));
    net::BufferedReader r2(*s2.value());
    EXPECT_FALSE(co_await next_frame(r2));
    EXPECT_EQ(c.node(0).bad_messages(), 2u);
    // A frame with an id and no message.
    auto s3 = co_await open();
    CO_ASSERT_OK(s3);
    Bytes id_only(2, 0x01);
    id_only[1] = 0x05;
    CO_ASSERT_OK(co_await s3.value()->write(id_only));
    net::BufferedReader r3(*s3.value());
    EXPECT_FALSE(co_await next_frame(r3));
    EXPECT_EQ(c.node(0).bad_messages(), 3u);
    EXPECT_EQ(c.node(0).channel_stats().served, 1u);
    co_await h.value()->stop();
  });
}

TEST(DhtChannel, ServerBoundsChannelsPerPeerAndClosesIdleOnes) {
  run_cluster_test([](NodeCluster& c) -> awaitable<void> {
    auto cfg = quick_config();
    cfg.channel_inbound_per_peer = 2;
    cfg.channel_server_idle = 300ms;
    CO_ASSERT_OK(co_await c.add(cfg));
    auto h = co_await raw_host(c, 0);
    CO_ASSERT_OK(h);
    std::vector<net::ByteStreamPtr> streams;
    std::vector<std::unique_ptr<net::BufferedReader>> readers;
    for (std::uint64_t i = 0; i < 3; ++i) {
      auto s = co_await h.value()->open_stream(c.node(0).peer(), kDhtChannelProtocol, 5s);
      CO_ASSERT_OK(s);
      CO_ASSERT_OK(co_await s.value()->write(encode_channel_frame(i + 1, ping_request())));
      streams.push_back(s.value());
      readers.push_back(std::make_unique<net::BufferedReader>(*s.value()));
      // One at a time: the server has taken this channel before the next one opens.
      auto a = co_await next_frame(*readers.back());
      EXPECT_EQ(a.has_value(), i < 2) << i;
    }
    EXPECT_EQ(c.node(0).channel_stats().refused, 1u);
    // The two accepted channels complete nothing more: the watchdog resets them.
    EXPECT_FALSE(co_await next_frame(*readers[0]));
    EXPECT_FALSE(co_await next_frame(*readers[1]));
    co_await h.value()->stop();
  });
}

namespace {
enum class FakeMode { good, unknown_id, garbage };

// A channel server outside the DHT: answers with a real core (good) or misbehaves. Ends when
// the requester closes the channel; `ended` counts the channels that ended.
struct FakeServer {
  std::shared_ptr<net::Host> host;
  std::unique_ptr<DhtCore> core;
  FakeMode mode = FakeMode::good;
  std::size_t ended = 0;
  std::unique_ptr<AsyncEvent> ended_ev;
};

awaitable<result<std::shared_ptr<FakeServer>>> fake_server(FakeMode mode) {
  auto ex = co_await asio::this_coro::executor;
  auto f = std::make_shared<FakeServer>();
  net::HostConfig hc;
  f->host = net::Host::create(ex, crypto::KeyPair::generate(), hc);
  ST_CO_TRY(co_await f->host->start());
  f->core = std::make_unique<DhtCore>(DhtConfig{}, f->host->local_peer(),
                                      ValidatorChain::standard(), 1, Clock::now());
  f->mode = mode;
  f->ended_ev = std::make_unique<AsyncEvent>(ex);
  FakeServer* fp = f.get();
  f->host->set_stream_handler(
      kDhtChannelProtocol, [fp](net::ByteStreamPtr s, net::PeerId from) -> awaitable<void> {
        net::BufferedReader r(*s);
        while (auto body = co_await next_frame(r)) {
          auto fr = decode_channel_frame(*body);
          if (!fr) break;
          Bytes out;
          if (fp->mode == FakeMode::unknown_id) {
            out = encode_channel_frame(fr.value().id + 1000, ping_request());
          } else if (fp->mode == FakeMode::garbage) {
            out = encode_channel_frame(fr.value().id, to_bytes("\xff\xff not a response"));
          } else {
            auto a = answer_request(*fp->core, from, fr.value().message, Now::from_clocks());
            if (!a) break;
            out = encode_channel_frame(fr.value().id, a.value());
          }
          if (!co_await s->write(out)) break;
        }
        ++fp->ended;
        fp->ended_ev->set();
      });
  co_return f;
}

net::Multiaddr addr_of(const FakeServer& f) {
  return f.host->listen_addresses().at(0).with_peer_id(f.host->local_peer());
}
}  // namespace

TEST(DhtChannel, RequesterClosesIdleChannels) {
  run_cluster_test([](NodeCluster& c) -> awaitable<void> {
    auto fake = co_await fake_server(FakeMode::good);
    CO_ASSERT_OK(fake);
    auto cfg = quick_config();
    cfg.channel_idle = 200ms;
    CO_ASSERT_OK(co_await c.add(cfg));
    std::vector<net::Multiaddr> seeds{addr_of(*fake.value())};
    (void)co_await c.node(0).bootstrap(seeds);  // its table may stay empty
    EXPECT_GE(c.node(0).channel_stats().answered, 1u);
    // The requester's sweeper closes the idle channel: the fake's handler sees the end.
    CO_ASSERT_OK(co_await with_timeout(fake.value()->ended_ev->wait(), 10s, "idle close"));
    EXPECT_EQ(c.node(0).bad_messages(), 0u);
    co_await fake.value()->host->stop();
  });
}

TEST(DhtChannel, BadAnswersCloseTheRequestersChannel) {
  for (auto mode : {FakeMode::unknown_id, FakeMode::garbage}) {
    run_cluster_test([mode](NodeCluster& c) -> awaitable<void> {
      auto fake = co_await fake_server(mode);
      CO_ASSERT_OK(fake);
      auto cfg = quick_config();
      cfg.bootstrap_attempts = 1;
      CO_ASSERT_OK(co_await c.add(cfg));
      std::vector<net::Multiaddr> seeds{addr_of(*fake.value())};
      auto b = co_await c.node(0).bootstrap(seeds);
      EXPECT_FALSE(b);  // the only seed never answered properly
      EXPECT_GE(c.node(0).bad_messages(), 1u);
      EXPECT_GE(c.node(0).channel_stats().failed, 1u);
      if (mode == FakeMode::garbage)
        EXPECT_GE(c.node(0).channel_stats().answered, 1u);
      else
        EXPECT_EQ(c.node(0).channel_stats().answered, 0u);
      CO_ASSERT_OK(co_await with_timeout(fake.value()->ended_ev->wait(), 10s, "channel closed"));
      co_await fake.value()->host->stop();
    });
  }
}

TEST(DhtChannel, FullChannelsFallBackToRpcAndOldOnesAreRenewed) {
  run_cluster_test([](NodeCluster& c) -> awaitable<void> {
    auto cfg = quick_config();
    cfg.channel_outstanding = 1;  // a second request to a busy peer goes as an RPC call
    cfg.channel_max_age = 1ms;    // a channel with nothing pending is replaced at the next use
    CO_ASSERT_OK(co_await c.add_many(4, cfg));
    auto key_of = [](int i) { return RecordKey::from_string("busy-key-" + std::to_string(i)); };
    for (int i = 0; i < 20; ++i)
      CO_ASSERT_OK(co_await c.node(1).store(key_of(i), to_bytes("v"), Millis(60'000)));
    const auto before = c.node(0).channel_stats();
    auto ex = co_await asio::this_coro::executor;
    std::size_t ok = 0;
    TaskScope scope(ex);
    for (int i = 0; i < 20; ++i)  // different keys: concurrent gets of one key are joined
      scope.spawn([&c, &ok, key = key_of(i)]() -> awaitable<void> {
        auto g = co_await c.node(0).get(key);
        if (g && g.value() && g.value()->plain && g.value()->plain->value == to_bytes("v")) ++ok;
      });
    CO_ASSERT_OK(co_await scope.join(60s));
    EXPECT_EQ(ok, 20u);
    const auto after = c.node(0).channel_stats();
    EXPECT_GT(after.rpc_sent, before.rpc_sent);  // 20 gets at once over 3 peers
    EXPECT_GT(after.sent, before.sent);
    const auto key = key_of(0);
    // Sequential gets: each finds its channels idle and older than 1 ms, so opens new ones.
    for (int i = 0; i < 3; ++i) {
      auto g = co_await c.node(0).get(key);
      CO_ASSERT_OK(g);
    }
    EXPECT_GT(c.node(0).channel_stats().opened, after.opened);
    EXPECT_EQ(c.node(0).bad_messages(), 0u);
  });
}
