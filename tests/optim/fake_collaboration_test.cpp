// The Hub double itself (fake_collaboration.hpp): a round that a peer's coroutine leaves by
// cancellation (the optimizer's shutdown closes its scope) no longer lists that peer, so a
// later close of the round never writes into the spans of a peer that is gone, nor posts to its
// (destroyed) io_context. That was the "free(): invalid pointer" at exit of the
// OptimizerCollaboration tests: peers shut down one after another with rounds in flight.
#include <gtest/gtest.h>

#include <future>

#include "optim/fake_collaboration.hpp"
#include "optim/linear_task.hpp"
#include "starling/core/blocking.hpp"
#include "support/round_data.hpp"

using namespace starling;
using namespace starling::training;

namespace {

RoundOptions round_options(const std::string& key, Duration timeout) {
  RoundOptions o;
  o.key = key;
  o.weight = 1;
  o.deadline = Clock::now() + timeout;
  return o;
}

}  // namespace

TEST(FakeCollaboration, CancelledRoundLeavesTheHub) {
  auto hub = std::make_shared<test::Hub>(30s);
  test::IoThread io_a, io_b, io_c;
  auto a = std::make_shared<test::FakeCollaboration>(hub, io_a.executor());
  auto b = std::make_shared<test::FakeCollaboration>(hub, io_b.executor());
  // A third live peer that never joins: the round stays open until its window ends.
  auto c = std::make_shared<test::FakeCollaboration>(hub, io_c.executor());
  const std::vector<float> ones(4, 1.0f), threes(4, 3.0f);
  const auto da = test::round_data({{"w", ones}});
  const auto db = test::round_data({{"w", threes}});

  // a joins first and waits for the window.
  auto a_done = std::make_shared<std::promise<result<RoundResult>>>();
  auto a_fut = a_done->get_future();
  asio::co_spawn(
      io_a.executor(),
      [a, da, a_done]() -> awaitable<void> {
        a_done->set_value(co_await a->average(da, round_options("k", 30s)));
      },
      asio::detached);
  ASSERT_TRUE(test::wait_until([&] { return hub->members_of("k") == 1; }, 10s));

  // b joins, then its wait is cancelled from outside (block_on's timeout cancels it).
  auto r = block_on(
      io_b.executor(),
      [b, db]() -> awaitable<result<RoundResult>> {
        co_return co_await b->average(db, round_options("k", 30s));
      },
      300ms);
  ASSERT_FALSE(r);
  EXPECT_EQ(hub->members_of("k"), 1u) << "the cancelled peer is still a member of the round";

  // Closing the round now averages a alone and never touches b's buffer.
  {
    std::lock_guard lk(hub->mu);
    hub->close_round("k");
  }
  ASSERT_EQ(a_fut.wait_for(10s), std::future_status::ready);
  auto ra = a_fut.get();
  ASSERT_TRUE(ra);
  EXPECT_EQ(ra.value().members.size(), 1u);
  EXPECT_EQ(da.output[0], 1.0f);
  EXPECT_TRUE(test::untouched(db)) << "the hub wrote into the output of a peer that left";
}
