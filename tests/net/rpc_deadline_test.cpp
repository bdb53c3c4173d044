// RPC over the FakeHost network: deadlines, cancellation (by the caller, a closing scope, a
// removed server), unresponsive and dying peers, and a thousand concurrent calls. Deadline
// overruns are bounded against a reference timer on the same executor.
#include "rpc_test_fixture.hpp"
#include "support/reference_timer.hpp"

using namespace starling;
using namespace starling::test::rpc;

// ---------------------------------------------------------------- deadlines, cancellation

// The deadlines below run on a moved clock (jump_when): the call waits until the jump and ends
// right after it, whatever the machine's load.
TEST_F(RpcTest, DeadlineExceededCancelsServerHandler) {
  result<StringValue> r = str("");
  Duration took{};
  bool handler_cancelled = false;
  jump_when(slow_begun, 1h);
  run([&]() -> awaitable<void> {
    auto t0 = Clock::now();
    // The handler would sleep 27 hours; the call allows one.
    r = co_await client.unary<StringValue, StringValue>(server_id, kSlow, str("100000000"),
                                                        {.timeout = 1h});
    took = ms_since(t0);
    handler_cancelled = bool(co_await with_timeout(slow_cancelled.wait(), 2s, "handler"));
  });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::timeout) << r.error().message();
  EXPECT_GE(took, 1h);
  EXPECT_LT(took, 1h + 20s);  // real time after the jump: no more than the test's bound
  EXPECT_NE(r.error().context().find("deadline of 3600000 ms exceeded"), std::string::npos)
      << r.error().context();
  EXPECT_TRUE(handler_cancelled);
  EXPECT_EQ(server.active_calls(), 0u);
}

TEST_F(RpcTest, ServerCapSendsDeadlineExceeded) {
  const std::string kCapped = "/test/capped/1.0.0";
  AsyncEvent capped_begun(io.get_executor());
  server.add_unary<StringValue, StringValue>(
      kCapped,
      [&](const net::RpcContext& ctx, StringValue) -> awaitable<result<StringValue>> {
        EXPECT_LE(ctx.remaining(), 1h);
        capped_begun.set();
        ST_CO_TRY(co_await sleep_for(27h));
        co_return str("late");
      },
      {.max_duration = 1h});
  result<StringValue> r = str("");
  Duration took{};
  jump_when(capped_begun, 1h);
  run([&]() -> awaitable<void> {
    auto t0 = Clock::now();
    r = co_await client.unary<StringValue, StringValue>(server_id, kCapped, str("x"),
                                                        {.timeout = 5h});
    took = ms_since(t0);
  });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), rpc_errc::deadline_exceeded) << r.error().message();
  EXPECT_GE(took, 1h);
  EXPECT_LT(took, 1h + 20s);
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
  AsyncEvent calling(io.get_executor());
  jump_when(calling, 1h);
  run([&]() -> awaitable<void> {
    auto t0 = Clock::now();
    calling.set();
    r = co_await client.unary<StringValue, StringValue>(server_id, kEcho, str("x"),
                                                        {.timeout = 1h});
    took = ms_since(t0);
  });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::timeout);
  EXPECT_GE(took, 1h);
  EXPECT_LT(took, 1h + 20s);
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
