// The caller's check of a downloaded state (LoadStateOptions::verify) runs on the worker pool:
// the node's I/O thread keeps serving peers while a slow check runs, and a check that outlives
// the load's deadline ends the load with a timeout.
#include <gtest/gtest.h>

#include "net_harness.hpp"
#include "starling/net/host.hpp"

using namespace starling;
using namespace starling::averaging;
using starling::averaging::test::Cluster;

namespace {

// A check that blocks until the test releases it (at most 20 s): a stand-in for hashing or
// decoding a large state. Owned by the check through a shared_ptr (it may outlive the load).
struct Gate {
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> was_released{false};
  std::atomic<bool> io_thread{false};
  std::thread::id io_id;
};

LoadStateOptions gated(const std::shared_ptr<Gate>& g) {
  LoadStateOptions o;
  o.verify = [g](const StateManifest&, BytesView) -> result<void> {
    g->io_thread = std::this_thread::get_id() == g->io_id;
    g->entered.set_value();
    g->was_released = g->released.wait_for(20s) == std::future_status::ready;
    return success();
  };
  return o;
}

void share_all(Cluster& c, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_TRUE(c.node(i).run([a = c.node(i).avg]() { return a->share_state(5, {}, 60s); }));
}

}  // namespace

TEST(StateVerify, IoThreadServesPeersDuringASlowCheck) {
  Cluster c(3, test::test_schema(2000), test::state_config("verify"), {}, 71);
  test::copy_tensors(c, 0, 1);
  share_all(c, 2);
  auto g = std::make_shared<Gate>();
  g->io_id = c.node(2).thread.get_id();
  auto o = gated(g);
  auto load =
      test::spawn_future(c.node(2).io, [a = c.node(2).avg, o]() { return a->load_state(o); });
  auto entered = g->entered.get_future();
  ASSERT_EQ(entered.wait_for(60s), std::future_status::ready) << "the check never ran";
  // While the check runs, node 0 pings node 2: node 2's I/O thread must answer.
  const auto peer = c.node(2).host->local_peer();
  auto rtt = c.node(0).run([h = c.node(0).host, peer]() { return net::ping(*h, peer, 3, 5s); });
  g->release.set_value();
  EXPECT_TRUE(rtt) << "node 2's I/O thread did not answer a ping during the check: "
                   << rtt.error().message();
  EXPECT_FALSE(g->io_thread.load()) << "the check ran on the I/O thread";
  ASSERT_EQ(load.wait_for(60s), std::future_status::ready);
  auto info = load.get();
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_TRUE(g->was_released.load());
  EXPECT_EQ(info.value().epoch, 5u);
  EXPECT_EQ(c.flat(2), c.flat(0));
}

TEST(StateVerify, CheckOutlivingTheDeadlineTimesOut) {
  Cluster c(3, test::test_schema(2000), test::state_config("verify"), {}, 73);
  test::copy_tensors(c, 0, 1);
  share_all(c, 2);
  const auto before = c.flat(2);
  auto g = std::make_shared<Gate>();
  g->io_id = c.node(2).thread.get_id();
  auto o = gated(g);
  o.timeout = 10s;
  auto load =
      test::spawn_future(c.node(2).io, [a = c.node(2).avg, o]() { return a->load_state(o); });
  auto entered = g->entered.get_future();
  ASSERT_EQ(entered.wait_for(60s), std::future_status::ready) << "the check never ran";
  // The load ends at its deadline although the check is still blocked.
  const auto st = load.wait_for(30s);
  g->release.set_value();
  ASSERT_EQ(st, std::future_status::ready) << "the load waited past its deadline for the check";
  auto info = load.get();
  ASSERT_FALSE(info);
  EXPECT_EQ(info.error(), errc::timeout) << info.error().message();
  EXPECT_EQ(c.flat(2), before);
}
