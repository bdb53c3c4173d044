// The blocking RPC client (rpc_blocking.hpp): calls from a plain thread, a deadline, and a
// refusal instead of a deadlock when called on the io thread itself.
#include <future>

#include "rpc_test_fixture.hpp"
#include "starling/core/blocking.hpp"
#include "starling/net/rpc_blocking.hpp"

using namespace starling;
using namespace starling::test::rpc;

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
