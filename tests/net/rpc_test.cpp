// RPC over the FakeHost network: happy paths of the three call kinds, remote errors,
// deadlines, cancellation, size limits, garbage on the wire, dying peers, many concurrent
// calls, and the blocking client.
#include <gtest/gtest.h>

#include <google/protobuf/wrappers.pb.h>
#include <future>

#include "starling/core/blocking.hpp"
#include "starling/net/rpc.hpp"
#include "starling/net/rpc_blocking.hpp"
#include "support/fake_host.hpp"
#include "support/reference_timer.hpp"

using namespace starling;
using google::protobuf::BytesValue;
using google::protobuf::StringValue;
using net::rpc_errc;

namespace {

const std::string kEcho = "/test/echo/1.0.0";
const std::string kSlow = "/test/slow/1.0.0";
const std::string kCount = "/test/count/1.0.0";
const std::string kChat = "/test/chat/1.0.0";

StringValue str(std::string s) {
  StringValue v;
  v.set_value(std::move(s));
  return v;
}

Duration ms_since(TimePoint t0) {
  return Clock::now() - t0;
}

class RpcTest : public ::testing::Test {
 protected:
  RpcTest() {
    server.add_unary<StringValue, StringValue>(
        kEcho,
        [this](const net::RpcContext& ctx, StringValue req) -> awaitable<result<StringValue>> {
          ++echo_calls;
          last_remote = ctx.remote();
          last_remaining = ctx.remaining();
          co_return str("echo:" + req.value());
        });
    // Sleeps for the number of milliseconds in the request; records cancellation.
    server.add_unary<StringValue, StringValue>(
        kSlow, [this](const net::RpcContext&, StringValue req) -> awaitable<result<StringValue>> {
          ++slow_started;
          auto slept = co_await sleep_for(std::chrono::milliseconds(std::stoi(req.value())));
          if (!slept) {
            slow_cancelled.set();
            co_return slept.error();
          }
          co_return str("slept");
        });
    // Streams N numbered messages.
    server.add_server_streaming<StringValue, StringValue>(
        kCount,
        [this](const net::RpcContext&, StringValue req,
               net::RpcWriter<StringValue>& out) -> awaitable<result<void>> {
          int n = std::stoi(req.value());
          for (int i = 0; i < n; ++i) {
            auto w = co_await out.write(str(std::to_string(i)));
            if (!w) {
              count_write_failed.set();
              co_return w.error();
            }
          }
          co_return success();
        });
    // Echoes every message with a prefix until the client closes.
    server.add_bidi<StringValue, StringValue>(
        kChat,
        [](const net::RpcContext&, net::RpcReader<StringValue>& in,
           net::RpcWriter<StringValue>& out) -> awaitable<result<void>> {
          for (;;) {
            ST_CO_TRY(auto msg, co_await in.read());
            if (!msg) co_return success();
            if (msg->value() == "fail") co_return make_error(errc::already_exists, "chat says no");
            ST_CO_TRY(co_await out.write(str("re:" + msg->value())));
          }
        });
  }

  // Runs `body` to completion (and everything it started); may be called repeatedly.
  void run(std::function<awaitable<void>()> body, Duration deadline = 30s) {
    io.restart();
    test::run_with_deadline(io, std::move(body), deadline);
  }

  asio::io_context io;
  test::FakeNetwork network{io};
  test::FakeHost& server_host = network.add_host();
  test::FakeHost& client_host = network.add_host();
  // ThousandConcurrentCalls makes 1000 calls at once from one peer.
  net::RpcServer server{server_host, {.max_calls_per_peer = 1000}};
  net::RpcClient client{client_host};
  const net::PeerId& server_id = server_host.local_peer();

  int echo_calls = 0;
  int slow_started = 0;
  net::PeerId last_remote;
  Duration last_remaining{};
  AsyncEvent slow_cancelled{io.get_executor()};
  AsyncEvent count_write_failed{io.get_executor()};
};

// ---------------------------------------------------------------- happy paths

TEST_F(RpcTest, UnaryEcho) {
  result<StringValue> got = make_error(errc::internal);
  run([&]() -> awaitable<void> {
    got = co_await client.unary<StringValue, StringValue>(server_id, kEcho, str("hello"),
                                                          {.timeout = 5s});
  });
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(got.value().value(), "echo:hello");
  EXPECT_EQ(echo_calls, 1);
  EXPECT_EQ(last_remote, client_host.local_peer());
  EXPECT_GT(last_remaining, 4s);
  EXPECT_LE(last_remaining, 5s + 5ms);  // the header rounds the remaining time up to a ms
  EXPECT_EQ(server.active_calls(), 0u);
  EXPECT_EQ(server_host.handlers_running(), 0u);
}

TEST_F(RpcTest, UnarySequentialCallsAndEmptyMessage) {
  int ok = 0;
  run([&]() -> awaitable<void> {
    for (int i = 0; i < 20; ++i) {
      auto r =
          co_await client.unary<StringValue, StringValue>(server_id, kEcho, str(std::to_string(i)));
      if (r && r.value().value() == "echo:" + std::to_string(i)) ++ok;
    }
    // An empty request (zero-byte protobuf) is a valid message.
    auto r = co_await client.unary<StringValue, StringValue>(server_id, kEcho, StringValue{});
    if (r && r.value().value() == "echo:") ++ok;
  });
  EXPECT_EQ(ok, 21);
}

TEST_F(RpcTest, ServerStreamingReadsAllThenEnd) {
  std::vector<std::string> got;
  result<void> end = success();
  run([&]() -> awaitable<void> {
    auto stream =
        co_await client.server_streaming<StringValue, StringValue>(server_id, kCount, str("100"));
    if (!stream) {
      end = stream.error();
      co_return;
    }
    for (;;) {
      auto m = co_await stream.value().read();
      if (!m) {
        end = m.error();
        break;
      }
      if (!m.value()) break;
      got.push_back(m.value()->value());
    }
    EXPECT_TRUE(stream.value().done());
  });
  ASSERT_TRUE(end) << end.error().message();
  ASSERT_EQ(got.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(got[i], std::to_string(i));
}

TEST_F(RpcTest, ServerStreamingCallbackAndZeroMessages) {
  int seen = 0;
  result<void> a = make_error(errc::internal), b = make_error(errc::internal);
  run([&]() -> awaitable<void> {
    a = co_await client.server_streaming_each<StringValue, StringValue>(
        server_id, kCount, str("7"), [&](StringValue&& m) -> result<void> {
          EXPECT_EQ(m.value(), std::to_string(seen));
          ++seen;
          return success();
        });
    b = co_await client.server_streaming_each<StringValue, StringValue>(
        server_id, kCount, str("0"), [&](StringValue&&) -> result<void> {
          ADD_FAILURE() << "no message expected";
          return success();
        });
  });
  ASSERT_TRUE(a) << a.error().message();
  ASSERT_TRUE(b) << b.error().message();
  EXPECT_EQ(seen, 7);
}

TEST_F(RpcTest, ServerStreamingCallbackErrorCancelsCall) {
  result<void> r = success();
  bool server_noticed = false;
  run([&]() -> awaitable<void> {
    int seen = 0;
    r = co_await client.server_streaming_each<StringValue, StringValue>(
        server_id, kCount, str("1000000"), [&](StringValue&&) -> result<void> {
          if (++seen == 3) return make_error(errc::cancelled, "enough");
          return success();
        });
    // The server's next writes fail once the reset arrives.
    server_noticed = bool(co_await with_timeout(count_write_failed.wait(), 5s, "server notices"));
  });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::cancelled);
  EXPECT_EQ(r.error().context(), "enough");
  EXPECT_TRUE(server_noticed);
}

TEST_F(RpcTest, BidiConcurrentReadAndWrite) {
  std::vector<std::string> replies;
  result<void> end = make_error(errc::internal);
  run([&]() -> awaitable<void> {
    auto call = co_await client.bidi<StringValue, StringValue>(server_id, kChat);
    if (!call) {
      end = call.error();
      co_return;
    }
    auto& c = call.value();
    // A writer coroutine sends 50 messages then closes; this coroutine reads concurrently.
    bool writer_ok = false;
    asio::co_spawn(
        io,
        [&]() -> awaitable<void> {
          for (int i = 0; i < 50; ++i)
            if (!co_await c.writer().write(str(std::to_string(i)))) co_return;
          writer_ok = bool(co_await c.close_write());
        },
        asio::detached);
    for (;;) {
      auto m = co_await c.reader().read();
      if (!m) {
        end = m.error();
        co_return;
      }
      if (!m.value()) break;
      replies.push_back(m.value()->value());
    }
    end = success();
    EXPECT_TRUE(writer_ok);
  });
  ASSERT_TRUE(end) << end.error().message();
  ASSERT_EQ(replies.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(replies[i], "re:" + std::to_string(i));
}

TEST_F(RpcTest, BidiPingPongThenServerError) {
  std::vector<std::string> replies;
  result<std::optional<StringValue>> last = make_error(errc::internal);
  run([&]() -> awaitable<void> {
    auto call = co_await client.bidi<StringValue, StringValue>(server_id, kChat);
    EXPECT_TRUE(call);
    if (!call) co_return;
    for (const char* m : {"a", "b", "c"}) {
      EXPECT_TRUE(co_await call.value().write(str(m)));
      auto r = co_await call.value().read();
      if (r && r.value()) replies.push_back(r.value()->value());
    }
    EXPECT_TRUE(co_await call.value().write(str("fail")));
    last = co_await call.value().read();
  });
  EXPECT_EQ(replies, (std::vector<std::string>{"re:a", "re:b", "re:c"}));
  ASSERT_FALSE(last);
  EXPECT_EQ(last.error(), rpc_errc::already_exists);
  EXPECT_NE(last.error().context().find("chat says no"), std::string::npos);
}

// ---------------------------------------------------------------- remote errors

TEST_F(RpcTest, RemoteErrorCodeAndMessageRoundTrip) {
  const std::string kFind = "/test/find/1.0.0";
  server.add_unary<StringValue, StringValue>(
      kFind, [](const net::RpcContext&, StringValue req) -> awaitable<result<StringValue>> {
        if (req.value() == "precondition")
          co_return Error(net::make_error_code(rpc_errc::failed_precondition), "not ready yet");
        co_return make_error(errc::not_found, "no such key: " + req.value());
      });
  result<StringValue> a = make_error(errc::internal), b = make_error(errc::internal);
  run([&]() -> awaitable<void> {
    a = co_await client.unary<StringValue, StringValue>(server_id, kFind, str("k1"));
    b = co_await client.unary<StringValue, StringValue>(server_id, kFind, str("precondition"));
  });
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error(), rpc_errc::not_found);
  EXPECT_TRUE(net::is_remote_error(a.error()));
  EXPECT_EQ(net::generic_errc(a.error()), errc::not_found);
  const auto& ctx = a.error().context();
  EXPECT_NE(ctx.find("no such key: k1"), std::string::npos) << ctx;
  EXPECT_NE(ctx.find(kFind), std::string::npos) << ctx;
  EXPECT_NE(ctx.find(server_id.short_string()), std::string::npos) << ctx;
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error(), rpc_errc::failed_precondition);
  EXPECT_NE(b.error().context().find("not ready yet"), std::string::npos);
}

TEST_F(RpcTest, HandlerExceptionBecomesInternal) {
  const std::string kThrow = "/test/throw/1.0.0";
  server.add_unary<StringValue, StringValue>(
      kThrow, [](const net::RpcContext&, StringValue) -> awaitable<result<StringValue>> {
        throw std::runtime_error("boom");
        co_return str("unreachable");
      });
  result<StringValue> r = make_error(errc::internal);
  run([&]() -> awaitable<void> {
    r = co_await client.unary<StringValue, StringValue>(server_id, kThrow, str("x"));
  });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), rpc_errc::internal);
  EXPECT_NE(r.error().context().find("handler threw: boom"), std::string::npos);
}

TEST_F(RpcTest, UnknownProtocolAndUnknownPeer) {
  result<StringValue> a = make_error(errc::internal), b = make_error(errc::internal);
  run([&]() -> awaitable<void> {
    a = co_await client.unary<StringValue, StringValue>(server_id, "/test/nope/1.0.0", str("x"));
    b = co_await client.unary<StringValue, StringValue>(test::make_peer_id(999), kEcho, str("x"));
  });
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error(), rpc_errc::unimplemented);
  EXPECT_NE(a.error().context().find("/test/nope/1.0.0"), std::string::npos);
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error(), errc::unavailable);
}

TEST(RpcErrors, MappingBothWays) {
  EXPECT_EQ(net::to_rpc_code(make_error(errc::timeout)), rpc_errc::deadline_exceeded);
  EXPECT_EQ(net::to_rpc_code(make_error(errc::too_large)), rpc_errc::resource_exhausted);
  EXPECT_EQ(net::to_rpc_code(make_error(errc::unsupported)), rpc_errc::unimplemented);
  EXPECT_EQ(net::to_rpc_code(make_error(errc::reset)), rpc_errc::unavailable);
  EXPECT_EQ(net::to_rpc_code(make_error(errc::internal)), rpc_errc::internal);
  EXPECT_EQ(net::to_rpc_code(Error(std::make_error_code(std::errc::io_error))), rpc_errc::unknown);
  EXPECT_EQ(net::to_rpc_code(Error(net::make_error_code(rpc_errc::aborted))), rpc_errc::aborted);
  EXPECT_EQ(net::to_errc(rpc_errc::deadline_exceeded), errc::timeout);
  EXPECT_EQ(net::to_errc(rpc_errc::unimplemented), errc::unsupported);
  EXPECT_EQ(net::to_errc(rpc_errc::resource_exhausted), errc::too_large);
  // Every starling errc survives errc -> wire code -> errc with its meaning, except the
  // transport family (closed/reset/io -> unavailable) and protocol_violation -> invalid_argument.
  for (int v = 1; v <= static_cast<int>(errc::internal); ++v) {
    auto e = static_cast<errc>(v);
    auto back = net::to_errc(net::to_rpc_code(make_error(e)));
    if (e == errc::closed || e == errc::reset || e == errc::io)
      EXPECT_EQ(back, errc::unavailable);
    else if (e == errc::protocol_violation)
      EXPECT_EQ(back, errc::invalid_argument);
    else
      EXPECT_EQ(back, e) << v;
  }
}

// ---------------------------------------------------------------- deadlines, cancellation

TEST_F(RpcTest, DeadlineExceededCancelsServerHandler) {
  result<StringValue> r = str("");
  Duration took{};
  bool handler_cancelled = false;
  test::ReferenceTimer ref(io.get_executor(), 300ms);
  run([&]() -> awaitable<void> {
    auto t0 = Clock::now();
    r = co_await client.unary<StringValue, StringValue>(server_id, kSlow, str("10000"),
                                                        {.timeout = 300ms});
    took = ms_since(t0);
    handler_cancelled = bool(co_await with_timeout(slow_cancelled.wait(), 2s, "handler"));
  });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::timeout) << r.error().message();
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, ref.elapsed() + 700ms);
  EXPECT_NE(r.error().context().find("deadline of 300 ms exceeded"), std::string::npos);
  EXPECT_TRUE(handler_cancelled);
  EXPECT_EQ(server.active_calls(), 0u);
}

TEST_F(RpcTest, ServerCapSendsDeadlineExceeded) {
  const std::string kCapped = "/test/capped/1.0.0";
  server.add_unary<StringValue, StringValue>(
      kCapped,
      [](const net::RpcContext& ctx, StringValue) -> awaitable<result<StringValue>> {
        EXPECT_LE(ctx.remaining(), 200ms);
        ST_CO_TRY(co_await sleep_for(10s));
        co_return str("late");
      },
      {.max_duration = 200ms});
  result<StringValue> r = str("");
  Duration took{};
  test::ReferenceTimer ref(io.get_executor(), 200ms);
  run([&]() -> awaitable<void> {
    auto t0 = Clock::now();
    r = co_await client.unary<StringValue, StringValue>(server_id, kCapped, str("x"),
                                                        {.timeout = 5s});
    took = ms_since(t0);
  });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), rpc_errc::deadline_exceeded) << r.error().message();
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, ref.elapsed() + 800ms);
}

TEST_F(RpcTest, CallerCancellationResetsStreamAndCancelsHandler) {
  result<StringValue> r = str("");
  bool handler_cancelled = false;
  Duration took{};
  test::ReferenceTimer ref(io.get_executor(), 200ms);
  run([&]() -> awaitable<void> {
    auto t0 = Clock::now();
    // The call itself would allow 30 s; the caller gives up after 200 ms.
    r = co_await with_timeout(
        client.unary<StringValue, StringValue>(server_id, kSlow, str("20000"), {.timeout = 30s}),
        200ms, "caller gave up");
    took = ms_since(t0);
    // The server learns of it from the stream reset, long before its 30 s deadline.
    handler_cancelled = bool(co_await with_timeout(slow_cancelled.wait(), 2s, "handler"));
  });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::timeout);
  EXPECT_LT(took, ref.elapsed() + 800ms);
  EXPECT_TRUE(handler_cancelled);
}

TEST_F(RpcTest, TaskScopeCloseCancelsCall) {
  result<StringValue> r = str("");
  bool handler_cancelled = false;
  run([&]() -> awaitable<void> {
    TaskScope scope(io.get_executor());
    // (A named lambda: the coroutine refers to its captures through the closure object.)
    auto call = [&]() -> awaitable<void> {
      r = co_await client.unary<StringValue, StringValue>(server_id, kSlow, str("20000"));
    };
    scope.spawn(call());
    (void)co_await sleep_for(100ms);
    EXPECT_EQ(slow_started, 1);
    auto closed = co_await scope.close(2s);
    EXPECT_TRUE(closed);
    handler_cancelled = bool(co_await with_timeout(slow_cancelled.wait(), 2s, "handler"));
  });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::cancelled) << r.error().message();
  EXPECT_TRUE(handler_cancelled);
}

TEST_F(RpcTest, UnresponsivePeerTimesOutOpening) {
  server_host.set_unresponsive(true);
  result<StringValue> r = str("");
  Duration took{};
  test::ReferenceTimer ref(io.get_executor(), 200ms);
  run([&]() -> awaitable<void> {
    auto t0 = Clock::now();
    r = co_await client.unary<StringValue, StringValue>(server_id, kEcho, str("x"),
                                                        {.timeout = 200ms});
    took = ms_since(t0);
  });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::timeout);
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, ref.elapsed() + 700ms);
}

TEST_F(RpcTest, BidiCancelAndDeadlineReachTheServer) {
  const std::string kListen = "/test/listen/1.0.0";
  int handler_errors = 0;
  AsyncEvent handler_done(io.get_executor());
  server.add_bidi<StringValue, StringValue>(
      kListen,
      [&](const net::RpcContext&, net::RpcReader<StringValue>& in,
          net::RpcWriter<StringValue>&) -> awaitable<result<void>> {
        for (;;) {
          auto m = co_await in.read();
          if (!m) {
            ++handler_errors;  // the client's reset ends the handler's read
            handler_done.set();
            co_return m.error();
          }
          if (!m.value()) co_return success();
        }
      });
  result<std::optional<StringValue>> idle = make_error(errc::internal);
  Duration took{};
  run([&]() -> awaitable<void> {
    {
      auto call = co_await client.bidi<StringValue, StringValue>(server_id, kListen);
      EXPECT_TRUE(call);
      if (!call) co_return;
      EXPECT_TRUE(co_await call.value().write(str("hi")));
      call.value().cancel();
      EXPECT_TRUE(co_await with_timeout(handler_done.wait(), 2s, "handler"));
      EXPECT_FALSE(co_await call.value().write(str("after cancel")));
    }
    // A bidi call whose deadline passes while the client waits for a reply.
    handler_done.reset();
    auto call =
        co_await client.bidi<StringValue, StringValue>(server_id, kListen, {.timeout = 200ms});
    EXPECT_TRUE(call);
    if (!call) co_return;
    auto t0 = Clock::now();
    idle = co_await call.value().read();
    took = ms_since(t0);
    EXPECT_TRUE(co_await with_timeout(handler_done.wait(), 2s, "handler"));
  });
  EXPECT_EQ(handler_errors, 2);
  ASSERT_FALSE(idle);
  EXPECT_EQ(idle.error(), errc::timeout);
  EXPECT_LT(took, 1s);
}

TEST_F(RpcTest, CallsInFlightSurviveServerRemoval) {
  auto extra = std::make_unique<net::RpcServer>(server_host);
  const std::string kLate = "/test/late/1.0.0";
  extra->add_unary<StringValue, StringValue>(
      kLate, [](const net::RpcContext&, StringValue req) -> awaitable<result<StringValue>> {
        ST_CO_TRY(co_await sleep_for(200ms));
        co_return str("late:" + req.value());
      });
  result<StringValue> in_flight = make_error(errc::internal), after = make_error(errc::internal);
  run([&]() -> awaitable<void> {
    asio::co_spawn(
        io,
        [&]() -> awaitable<void> {
          (void)co_await sleep_for(50ms);
          extra.reset();  // unregisters the method while the first call runs
        },
        asio::detached);
    in_flight = co_await client.unary<StringValue, StringValue>(server_id, kLate, str("x"));
    after = co_await client.unary<StringValue, StringValue>(server_id, kLate, str("y"));
  });
  ASSERT_TRUE(in_flight) << in_flight.error().message();
  EXPECT_EQ(in_flight.value().value(), "late:x");
  ASSERT_FALSE(after);
  EXPECT_EQ(after.error(), rpc_errc::unimplemented);
}

// ---------------------------------------------------------------- dying peers

TEST_F(RpcTest, ServerDiesMidCall) {
  result<StringValue> r = str("");
  Duration took{};
  run([&]() -> awaitable<void> {
    asio::co_spawn(
        io,
        [&]() -> awaitable<void> {
          (void)co_await sleep_for(100ms);
          server_host.kill();
        },
        asio::detached);
    auto t0 = Clock::now();
    r = co_await client.unary<StringValue, StringValue>(server_id, kSlow, str("20000"),
                                                        {.timeout = 10s});
    took = ms_since(t0);
  });
  ASSERT_FALSE(r);
  EXPECT_FALSE(net::is_remote_error(r.error())) << r.error().message();
  EXPECT_LT(took, 2s) << r.error().message();
}

TEST_F(RpcTest, ServerDiesMidStream) {
  const std::string kTrickle = "/test/trickle/1.0.0";
  server.add_server_streaming<StringValue, StringValue>(
      kTrickle,
      [](const net::RpcContext&, StringValue,
         net::RpcWriter<StringValue>& out) -> awaitable<result<void>> {
        for (int i = 0; i < 5; ++i) ST_CO_TRY(co_await out.write(str(std::to_string(i))));
        ST_CO_TRY(co_await sleep_for(20s));
        co_return success();
      });
  int received = 0;
  result<void> end = success();
  Duration took{};
  run([&]() -> awaitable<void> {
    auto t0 = Clock::now();
    asio::co_spawn(
        io,
        [&]() -> awaitable<void> {
          (void)co_await sleep_for(150ms);
          server_host.kill();
        },
        asio::detached);
    end = co_await client.server_streaming_each<StringValue, StringValue>(
        server_id, kTrickle, str(""),
        [&](StringValue&&) -> result<void> {
          ++received;
          return success();
        },
        {.timeout = 10s});
    took = ms_since(t0);
  });
  EXPECT_EQ(received, 5);
  ASSERT_FALSE(end);
  EXPECT_LT(took, 2s);
}

TEST_F(RpcTest, ClientDiesMidCallCancelsHandler) {
  bool handler_cancelled = false;
  run([&]() -> awaitable<void> {
    asio::co_spawn(
        io,
        [&]() -> awaitable<void> {
          (void)co_await client.unary<StringValue, StringValue>(server_id, kSlow, str("20000"));
        },
        asio::detached);
    (void)co_await sleep_for(100ms);
    client_host.kill();
    handler_cancelled = bool(co_await with_timeout(slow_cancelled.wait(), 2s, "handler"));
  });
  EXPECT_TRUE(handler_cancelled);
  EXPECT_EQ(server.active_calls(), 0u);
}

// ---------------------------------------------------------------- load

TEST_F(RpcTest, ThousandConcurrentCalls) {
  constexpr int kCalls = 1000;
  int ok = 0, done = 0;
  run(
      [&]() -> awaitable<void> {
        AsyncEvent all_done(io.get_executor());
        for (int i = 0; i < kCalls; ++i)
          asio::co_spawn(
              io,
              [&, i]() -> awaitable<void> {
                auto r = co_await client.unary<StringValue, StringValue>(
                    server_id, kEcho, str(std::to_string(i)), {.timeout = 20s});
                if (r && r.value().value() == "echo:" + std::to_string(i))
                  ++ok;
                else if (!r)
                  ADD_FAILURE() << r.error().message();
                if (++done == kCalls) all_done.set();
              },
              asio::detached);
        (void)co_await with_timeout(all_done.wait(), 25s, "all calls");
      },
      60s);
  EXPECT_EQ(ok, kCalls);
  EXPECT_EQ(echo_calls, kCalls);
  EXPECT_EQ(server.active_calls(), 0u);
}

TEST(RpcServerLimits, TooManyConcurrentCallsGetUnavailable) {
  asio::io_context io;
  test::FakeNetwork network(io);
  auto& sh = network.add_host();
  auto& ch = network.add_host();
  net::RpcServer server(sh, {.max_concurrent_calls = 2});
  server.add_unary<StringValue, StringValue>(
      kSlow, [](const net::RpcContext&, StringValue) -> awaitable<result<StringValue>> {
        ST_CO_TRY(co_await sleep_for(300ms));
        co_return str("done");
      });
  net::RpcClient client(ch);
  std::vector<result<StringValue>> results;
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    int finished = 0;
    AsyncEvent all(io.get_executor());
    for (int i = 0; i < 3; ++i) {
      asio::co_spawn(
          io,
          [&]() -> awaitable<void> {
            results.push_back(
                co_await client.unary<StringValue, StringValue>(sh.local_peer(), kSlow, str("")));
            if (++finished == 3) all.set();
          },
          asio::detached);
      (void)co_await sleep_for(20ms);  // make the arrival order deterministic
    }
    (void)co_await with_timeout(all.wait(), 5s, "calls");
  });
  ASSERT_EQ(results.size(), 3u);
  // The third call is refused at once, so it finishes first.
  ASSERT_FALSE(results[0]);
  EXPECT_EQ(results[0].error(), rpc_errc::unavailable);
  EXPECT_TRUE(results[1]);
  EXPECT_TRUE(results[2]);
}

// ---------------------------------------------------------------- blocking facade

TEST(BlockingRpc, CallsFromPlainThreadAndRefusesOnIoThread) {
  IoThread io_thread("rpc-test-io");
  std::unique_ptr<test::FakeNetwork> network;
  std::unique_ptr<net::RpcServer> server;
  test::FakeHost* sh = nullptr;
  test::FakeHost* ch = nullptr;
  // Build the node on its own thread.
  auto built = block_on(
      io_thread.executor(),
      [&]() -> awaitable<result<void>> {
        network = std::make_unique<test::FakeNetwork>(io_thread.context());
        sh = &network->add_host();
        ch = &network->add_host();
        server = std::make_unique<net::RpcServer>(*sh);
        server->add_unary<StringValue, StringValue>(
            kEcho, [](const net::RpcContext&, StringValue req) -> awaitable<result<StringValue>> {
              co_return str("echo:" + req.value());
            });
        server->add_unary<StringValue, StringValue>(
            kSlow, [](const net::RpcContext&, StringValue) -> awaitable<result<StringValue>> {
              ST_CO_TRY(co_await sleep_for(10s));
              co_return str("late");
            });
        server->add_server_streaming<StringValue, StringValue>(
            kCount,
            [](const net::RpcContext&, StringValue req,
               net::RpcWriter<StringValue>& out) -> awaitable<result<void>> {
              for (int i = 0; i < std::stoi(req.value()); ++i)
                ST_CO_TRY(co_await out.write(str(std::to_string(i))));
              co_return success();
            });
        co_return success();
      },
      5s);
  ASSERT_TRUE(built) << built.error().message();

  net::BlockingRpcClient client(*ch);
  auto r = client.unary<StringValue, StringValue>(sh->local_peer(), kEcho, str("sync"));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value().value(), "echo:sync");

  auto all = client.server_streaming<StringValue, StringValue>(sh->local_peer(), kCount, str("4"));
  ASSERT_TRUE(all) << all.error().message();
  ASSERT_EQ(all.value().size(), 4u);
  EXPECT_EQ(all.value()[3].value(), "3");

  auto t0 = Clock::now();
  auto slow =
      client.unary<StringValue, StringValue>(sh->local_peer(), kSlow, str(""), {.timeout = 200ms});
  ASSERT_FALSE(slow);
  EXPECT_EQ(slow.error(), errc::timeout);
  EXPECT_LT(Clock::now() - t0, 1500ms);

  // On the io thread itself the blocking client refuses instead of deadlocking.
  std::promise<result<StringValue>> on_io;
  asio::post(io_thread.executor(), [&] {
    on_io.set_value(client.unary<StringValue, StringValue>(sh->local_peer(), kEcho, str("x")));
  });
  auto fut = on_io.get_future();
  ASSERT_EQ(fut.wait_for(5s), std::future_status::ready);
  auto refused = fut.get();
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(), errc::internal);

  // Tear the node down on its thread, then stop the thread.
  auto torn = block_on(
      io_thread.executor(),
      [&]() -> awaitable<result<void>> {
        server.reset();
        (void)co_await sh->stop(2s);
        (void)co_await ch->stop(2s);
        co_return success();
      },
      5s);
  EXPECT_TRUE(torn);
  EXPECT_TRUE(io_thread.stop(2s));
  network.reset();
}

}  // namespace
