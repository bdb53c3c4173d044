// A peer that falls behind downloads the state from peers that are, most of the time, inside a
// round: a synchronous trainer blocked in its round still serves its state (its training
// thread serves state requests from the round's wait, every 20 ms), so the download does not
// wait for the round to end.
#include <gtest/gtest.h>

#include "optim/hub_peer.hpp"
#include "starling/core/blocking.hpp"

using namespace starling;
using namespace starling::optim;
using namespace starling::training;

TEST(StateServing, ADonorInASynchronousRoundServesItsStateMeanwhile) {
  // A round closes when every live peer joined it or 4 s after its first joiner.
  auto hub = std::make_shared<test::Hub>(4s);
  // A live computing peer at epoch 0 that never averages: the donor's round waits for it the
  // whole window.
  test::IoThread io_c;
  auto c = std::make_shared<test::FakeCollaboration>(hub, io_c.executor());
  PeerProgress p;
  p.samples_per_second = 100;
  p.seq = 1;
  p.ttl = 60s;
  p.publish_interval = 200ms;
  auto published = block_on(
      io_c.executor(),
      [c, p]() -> awaitable<result<void>> {
        co_return co_await c->publish_progress(encode_progress(p), 60s);
      },
      10s);
  ASSERT_TRUE(published) << published.error().message();

  std::mutex mu;
  std::map<std::uint64_t, std::vector<torch::Tensor>> record;
  test::HubPeer donor(hub, 1, test::hub_options("serving", 64, 8));
  donor.start(7, mu, record);
  ASSERT_TRUE(test::wait_until([&] { return hub->members_of("grads/0") == 1; }, 30s))
      << "the donor never began the round of epoch 0";

  // A newcomer downloads the state while the donor's training thread waits in that round.
  test::IoThread io_d;
  auto d = std::make_shared<test::FakeCollaboration>(hub, io_d.executor());
  const auto t0 = Clock::now();
  auto state = block_on(
      io_d.executor(),
      [d]() -> awaitable<result<Collaboration::State>> {
        co_return co_await d->download_state(Clock::now() + 10s, 0);
      },
      15s);
  const auto took = Clock::now() - t0;
  ASSERT_TRUE(state) << state.error().message();
  EXPECT_EQ(state.value().epoch, 0u);
  EXPECT_FALSE(state.value().bytes.empty());
  EXPECT_LT(took, 2s) << "the download waited for the donor's round to end";
  EXPECT_EQ(hub->members_of("grads/0"), 1u) << "the round ended before the download";

  donor.stop = true;
  if (donor.thread.joinable()) donor.thread.join();
  EXPECT_TRUE(donor.opt->shutdown(10s));
}
