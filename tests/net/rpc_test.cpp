// RPC over the FakeHost network: happy paths of the three call kinds and remote errors.
// Deadlines, cancellation, dying peers and load: rpc_deadline_test.cpp; the blocking client:
// rpc_blocking_test.cpp; size limits and garbage on the wire: rpc_wire_test.cpp; server caps:
// rpc_limits_test.cpp.
#include "rpc_test_fixture.hpp"

using namespace starling;
using namespace starling::test::rpc;

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
