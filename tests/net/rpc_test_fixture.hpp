// Shared by the RPC tests over the FakeHost network (rpc_test.cpp, rpc_deadline_test.cpp,
// rpc_blocking_test.cpp): test protocols, and the RpcTest fixture with a server offering echo,
// a slow call, a counting stream and a chat.
#pragma once

#include <gtest/gtest.h>

#include <google/protobuf/wrappers.pb.h>

#include <functional>
#include <string>

#include "starling/net/rpc.hpp"
#include "support/fake_host.hpp"

namespace starling::test::rpc {

using google::protobuf::BytesValue;
using google::protobuf::StringValue;
using net::rpc_errc;

inline const std::string kEcho = "/test/echo/1.0.0";
inline const std::string kSlow = "/test/slow/1.0.0";
inline const std::string kCount = "/test/count/1.0.0";
inline const std::string kChat = "/test/chat/1.0.0";

inline StringValue str(std::string s) {
  StringValue v;
  v.set_value(std::move(s));
  return v;
}

inline Duration ms_since(TimePoint t0) {
  return Clock::now() - t0;
}

class RpcTest : public ::testing::Test {
 protected:
  RpcTest() {
    enable_clock_jumps();
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
          slow_begun.set();
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

  // Moves the clock (advance_clock) by `d` once `ready` is set, from a coroutine of its own:
  // a deadline test then waits for no real time, and no load can expire its deadline early.
  void jump_when(AsyncEvent& ready, Duration d) {
    asio::co_spawn(
        io,
        [&ready, d]() -> awaitable<void> {
          co_await ready.wait();
          // Let the waiting side arm its timers first (it runs until it suspends).
          co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
          advance_clock(d);
        },
        asio::detached);
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
  AsyncEvent slow_begun{io.get_executor()};
  AsyncEvent slow_cancelled{io.get_executor()};
  AsyncEvent count_write_failed{io.get_executor()};
};

}  // namespace starling::test::rpc
