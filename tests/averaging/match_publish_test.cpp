// MatchSession publishing: a change to this peer's entry made while its first put is still in
// flight (matchmaking cancelled, a follower joined) is published after that put. The directory
// below lands every put at once but answers the first one only after a hold, like a DHT store
// still on its way while the session goes on: an hour on the moved clock (advance_clock), ended
// by the test once its cancel has landed, so no load can end the hold first.
#include <gtest/gtest.h>

#include <future>
#include <mutex>
#include "starling/core/timer.hpp"

#include "net_harness.hpp"
#include "starling/averaging/wire.hpp"

using namespace starling;
using namespace starling::averaging;
using starling::averaging::test::base_config;
using starling::averaging::test::Cluster;

namespace {

class HeldFirstPutDirectory final : public Directory {
 public:
  explicit HeldFirstPutDirectory(Duration hold) : hold_(hold) {}

  awaitable<result<void>> put(Bytes key, Bytes subkey, Bytes value, WallTime expires) override {
    auto entry = wire::decode_entry(value);
    auto r = co_await inner_.put(std::move(key), std::move(subkey), std::move(value), expires);
    bool first = false;
    {
      std::lock_guard lock(mu_);
      if (entry) entries_.push_back(entry.value());
      first = entry && entries_.size() == 1;
    }
    if (first) {
      landed_.set_value();
      Timer t(co_await asio::this_coro::executor, hold_);
      (void)co_await t.async_wait(use_nothrow);
    }
    co_return r;
  }
  awaitable<result<std::vector<Bytes>>> get(Bytes key) override {
    co_return co_await inner_.get(std::move(key));
  }

  // The first match entry has landed (its put has not answered yet).
  std::future<void> landed() { return landed_.get_future(); }
  std::vector<MatchEntry> entries() {
    std::lock_guard lock(mu_);
    return entries_;
  }

 private:
  Duration hold_;
  MemoryDirectory inner_;
  std::mutex mu_;
  std::vector<MatchEntry> entries_;
  std::promise<void> landed_;
};

}  // namespace

// Seen in `bench/training_net.sh`: a trainer reached --max-seconds right after it began
// matchmaking for the next round; its cancel came during its first put, the closed entry was
// never published, and the other three waited out the 15 s matchmaking deadline for it.
TEST(MatchPublish, AStepCancelledDuringItsFirstPutLeavesItsEntryClosed) {
  enable_clock_jumps();
  auto dir = std::make_shared<HeldFirstPutDirectory>(1h);
  auto landed = dir->landed();
  Cluster c(1, test::test_schema(64), base_config(), {}, 1, dir);
  StepOptions o;
  o.round = "r/1";
  // Beyond the held put: the jump must not end the step itself.
  o.timeout = 10h;
  o.matchmaking_timeout = 5h;
  auto step =
      c.node(0).run([a = c.node(0).avg, o]() -> awaitable<result<std::shared_ptr<PendingStep>>> {
        co_return a->begin(o);
      });
  ASSERT_TRUE(step) << step.error().message();
  auto p = step.value();
  ASSERT_EQ(landed.wait_for(10s), std::future_status::ready);
  c.node(0).run([p]() -> awaitable<int> {
    p->cancel();
    co_return 0;
  });
  // The cancel has landed inside the held put: now the put answers.
  advance_clock(1h);
  const bool ended =
      c.node(0).run([p]() -> awaitable<bool> { co_return co_await p->wait(Clock::now() + 20s); });
  ASSERT_TRUE(ended);
  const auto entries = dir->entries();
  ASSERT_GE(entries.size(), 1u);
  EXPECT_TRUE(entries.front().open);
  EXPECT_FALSE(entries.back().open) << entries.size() << " entries published, the last one open";
}
