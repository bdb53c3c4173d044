// RPC server bounds: a peer holding max_calls_per_peer calls gets the next ones refused
// (RESOURCE_EXHAUSTED) while other peers are still served, and its slots come back when its
// calls end; past max_concurrent_calls (all peers) a call is refused with UNAVAILABLE.
#include <gtest/gtest.h>

#include <google/protobuf/wrappers.pb.h>

#include "starling/net/rpc.hpp"
#include "support/fake_host.hpp"

using namespace starling;
using google::protobuf::StringValue;
using net::rpc_errc;

namespace {

const std::string kHold = "/test/hold/1.0.0";  // waits until the test releases it
const std::string kEcho = "/test/echo/1.0.0";

StringValue str(std::string s) {
  StringValue v;
  v.set_value(std::move(s));
  return v;
}

struct LimitsFixture {
  explicit LimitsFixture(net::RpcServerOptions opts) : server(server_host, opts) {
    server.add_unary<StringValue, StringValue>(
        kHold, [this](const net::RpcContext&, StringValue) -> awaitable<result<StringValue>> {
          if (++held == hold_target) all_held.set();
          ST_CO_TRY(co_await release.wait());
          co_return str("released");
        });
    server.add_unary<StringValue, StringValue>(
        kEcho, [](const net::RpcContext&, StringValue req) -> awaitable<result<StringValue>> {
          co_return str("echo:" + req.value());
        });
  }

  // Starts `n` hold calls from `from`; counts outcomes; sets `settled` once `expect_settled`
  // of them ended (success or error).
  void start_holds(net::RpcClient& from, int n) {
    for (int i = 0; i < n; ++i)
      asio::co_spawn(
          io,
          [&]() -> awaitable<void> {
            auto r = co_await from.unary<StringValue, StringValue>(server_host.local_peer(), kHold,
                                                                   str(""), {.timeout = 20s});
            if (r)
              ++ok;
            else if (r.error() == rpc_errc::resource_exhausted)
              ++refused;
            else
              ADD_FAILURE() << r.error().message();
            if (++ended == expect_ended) settled.set();
          },
          asio::detached);
  }

  asio::io_context io;
  test::FakeNetwork network{io};
  test::FakeHost& server_host = network.add_host();
  test::FakeHost& hostile_host = network.add_host();
  test::FakeHost& honest_host = network.add_host();
  net::RpcServer server;
  net::RpcClient hostile{hostile_host};
  net::RpcClient honest{honest_host};
  AsyncEvent release{io.get_executor()};
  AsyncEvent all_held{io.get_executor()};
  AsyncEvent settled{io.get_executor()};
  int held = 0, hold_target = 0;
  int ok = 0, refused = 0, ended = 0, expect_ended = 0;
};

}  // namespace

// A peer opening more calls than the default cap (256): the excess is refused at once, another
// peer is served meanwhile, and after the held calls end the peer may call again.
TEST(RpcPerPeerLimit, PeerOverTheDefaultCapIsRefusedOthersServed) {
  LimitsFixture f(net::RpcServerOptions{});
  constexpr int kCap = 256, kOver = 40;
  f.hold_target = kCap;
  f.expect_ended = kOver;  // the refusals end first; the held calls wait for the release
  test::run_with_deadline(
      f.io,
      [&]() -> awaitable<void> {
        f.start_holds(f.hostile, kCap + kOver);
        CO_ASSERT_TRUE(co_await with_timeout(f.all_held.wait(), 20s, "cap reached"));
        CO_ASSERT_TRUE(co_await with_timeout(f.settled.wait(), 20s, "refusals"));
        EXPECT_EQ(f.refused, kOver);
        EXPECT_EQ(f.ok, 0);
        EXPECT_EQ(f.server.active_calls(f.hostile_host.local_peer()), std::size_t(kCap));
        EXPECT_EQ(f.server.refused_per_peer(), std::uint64_t(kOver));

        // The node stays responsive: another peer is served while the hostile one is at its cap.
        auto other = co_await f.honest.unary<StringValue, StringValue>(
            f.server_host.local_peer(), kEcho, str("hi"), {.timeout = 5s});
        CO_ASSERT_TRUE(other);
        EXPECT_EQ(other.value().value(), "echo:hi");

        // Released, every held call succeeds and the peer's slots are free again.
        f.settled.reset();
        f.expect_ended = kCap + kOver;
        f.release.set();
        CO_ASSERT_TRUE(co_await with_timeout(f.settled.wait(), 20s, "held calls"));
        EXPECT_EQ(f.ok, kCap);
        auto again = co_await f.hostile.unary<StringValue, StringValue>(
            f.server_host.local_peer(), kEcho, str("again"), {.timeout = 5s});
        EXPECT_TRUE(again);
      },
      60s);
  EXPECT_EQ(f.server.active_calls(), 0u);
  EXPECT_EQ(f.server.active_calls(f.hostile_host.local_peer()), 0u);
}

// The cap is per peer, over all methods together, and configurable (0: unbounded).
TEST(RpcPerPeerLimit, CapCountsAllMethodsAndZeroDisablesIt) {
  LimitsFixture f(net::RpcServerOptions{.max_calls_per_peer = 3});
  f.hold_target = 3;
  f.expect_ended = 1;
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    f.start_holds(f.hostile, 3);
    CO_ASSERT_TRUE(co_await with_timeout(f.all_held.wait(), 10s, "cap reached"));
    auto echo = co_await f.hostile.unary<StringValue, StringValue>(
        f.server_host.local_peer(), kEcho, str("x"), {.timeout = 5s});
    CO_ASSERT_TRUE(!echo);
    EXPECT_EQ(echo.error(), rpc_errc::resource_exhausted) << echo.error().message();
    f.expect_ended = 3;
    f.release.set();
    CO_ASSERT_TRUE(co_await with_timeout(f.settled.wait(), 10s, "held calls"));
    EXPECT_EQ(f.ok, 3);
  });

  LimitsFixture g(net::RpcServerOptions{.max_calls_per_peer = 0});
  g.hold_target = 300;
  g.expect_ended = 300;
  test::run_with_deadline(
      g.io,
      [&]() -> awaitable<void> {
        g.start_holds(g.hostile, 300);
        CO_ASSERT_TRUE(co_await with_timeout(g.all_held.wait(), 20s, "all held"));
        g.release.set();
        CO_ASSERT_TRUE(co_await with_timeout(g.settled.wait(), 20s, "held calls"));
        EXPECT_EQ(g.ok, 300);
      },
      60s);
}

// The server-wide cap: with max_concurrent_calls calls in progress the next one, from any
// peer, is refused at once (it never reaches a handler) while those in progress go on.
TEST(RpcServerLimits, TooManyConcurrentCallsGetUnavailable) {
  LimitsFixture f(net::RpcServerOptions{.max_concurrent_calls = 2});
  f.hold_target = 2;
  f.expect_ended = 2;
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    f.start_holds(f.hostile, 2);
    CO_ASSERT_TRUE(co_await with_timeout(f.all_held.wait(), 10s, "two calls held"));
    EXPECT_EQ(f.server.active_calls(), 2u);
    auto third = co_await f.honest.unary<StringValue, StringValue>(f.server_host.local_peer(),
                                                                   kHold, str(""), {.timeout = 5s});
    CO_ASSERT_TRUE(!third);
    EXPECT_EQ(third.error(), rpc_errc::unavailable) << third.error().message();
    EXPECT_EQ(f.held, 2);   // the refused call never reached the handler
    EXPECT_EQ(f.ended, 0);  // the held calls are still in progress
    f.release.set();
    CO_ASSERT_TRUE(co_await with_timeout(f.settled.wait(), 10s, "held calls"));
    EXPECT_EQ(f.ok, 2);
  });
  EXPECT_EQ(f.server.active_calls(), 0u);
}
