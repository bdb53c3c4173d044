// RoundRunner over real streams against a scripted peer (runner_harness.hpp): stream ends,
// and how the end of a round waits for its pool tasks.
#include <atomic>
#include <future>

#include "runner_harness.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace starling::averaging::test;

namespace {

averaging::detail::RoundRunnerConfig small_config() {
  averaging::detail::RoundRunnerConfig c;
  c.round.part_elems = 1000;
  c.round.stall_timeout = 20s;
  c.keepalive_interval = 200ms;
  c.open_timeout = 10s;
  c.linger = 500ms;
  return c;
}

}  // namespace

// Member 1 half-closes the stream member 0 opened to it at once (it never writes there) and
// sends everything on its own stream. The first EOF is not the peer closing: before the runner
// counted a peer closed only when all its streams had ended, it failed member 1 here.
TEST(RoundRunner, EarlyHalfCloseOfOneStreamIsNotAFailure) {
  RunnerPair rp(10'000, small_config(), 20s, /*close_inbound_early=*/true);
  auto fut = rp.start();
  ASSERT_EQ(fut.wait_for(30s), std::future_status::ready);
  auto r = fut.get();
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_TRUE(rp.runner->core().failed().none()) << rp.runner->core().failed().to_string();
  auto peer_done = rp.on_io(
      [&]() -> awaitable<bool> { co_return rp.peer->core().status() == RoundCore::Status::done; });
  ASSERT_TRUE(peer_done);
  EXPECT_EQ(std::memcmp(rp.out0.data(), rp.peer->output().data(), rp.out0.size() * 4), 0);
}

// A reduction stuck on the pool (the hook blocks until released) must not hold the round
// forever: run() returns by deadline + linger (plus the bounded shutdown), and the task, when
// it finally runs, leaves the round's buffers alone. Before the bound, run() never returned.
TEST(RoundRunner, StuckReductionDoesNotHangTheRound) {
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  std::atomic<int> hooked{0};
  auto cfg = small_config();
  cfg.before_reduce = [released, &hooked](std::uint32_t) {
    ++hooked;
    released.wait();
  };
  const auto deadline = 2s;
  RunnerPair rp(6'000, cfg, deadline, false);
  const auto t0 = Clock::now();
  auto fut = rp.start();
  const bool ready = fut.wait_for(deadline + cfg.linger + 6s) == std::future_status::ready;
  release->set_value();
  ASSERT_TRUE(ready) << "run() did not return while a reduction was stuck";
  const auto took = Clock::now() - t0;
  auto r = fut.get();
  EXPECT_FALSE(r);
  EXPECT_GT(hooked.load(), 0);
  EXPECT_LT(took, deadline + cfg.linger + 5s);
  rp.pool.shutdown();  // joins the workers: the released tasks have returned
  // Member 0's parts were never reduced after the round gave up on them.
  for (const auto& part : rp.runner->core().plan().parts) {
    if (part.owner != 0) continue;
    for (auto e = part.begin; e < part.end; e += 101) {
      EXPECT_TRUE(std::isnan(rp.out0[e])) << "element " << e << " written after the round ended";
    }
  }
}

// A reduction that is slow (simulated compute in the hook) but finishes before deadline +
// linger: run() returns only after it, so no pool task touches the buffers afterwards.
TEST(RoundRunner, RunWaitsForARunningReduction) {
  auto cfg = small_config();
  cfg.linger = 1500ms;
  const auto deadline = 1500ms;
  const TimePoint slow_until = Clock::now() + deadline + 800ms;
  std::atomic<bool> returned{false};
  cfg.before_reduce = [slow_until, &returned](std::uint32_t) {
    std::this_thread::sleep_until(slow_until);  // slow compute, past the round's deadline
    returned = true;
  };
  RunnerPair rp(3'000, cfg, deadline, false);
  auto fut = rp.start();
  ASSERT_EQ(fut.wait_for(deadline + cfg.linger + 8s), std::future_status::ready);
  auto r = fut.get();
  EXPECT_FALSE(r);  // the core timed out waiting for its own reduction
  EXPECT_TRUE(returned.load()) << "run() returned while a reduction was still running";
  bool reduced = false;
  for (const auto& part : rp.runner->core().plan().parts)
    if (part.owner == 0) reduced |= !std::isnan(rp.out0[part.begin]);
  EXPECT_TRUE(reduced) << "the running reduction was not let finish";
}
