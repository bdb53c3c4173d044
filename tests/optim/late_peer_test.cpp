// A peer that falls behind (its round failed because the others had moved on) downloads their
// state and joins the next round at once: the failed round's retry backoff belonged to the
// epoch it failed at. Before, a late starter sat out the backoff at every new epoch, missed
// round after round and dropped the samples it computed meanwhile at each download.
#include <gtest/gtest.h>

#include "optim/gated_peer.hpp"
#include "starling/optim/training_state.hpp"

using namespace starling;
using namespace starling::optim;
using namespace starling::training;

using test::batch;
using test::make_linear;
using test::wait_until;

namespace {

void put_record(test::Hub& hub, const net::PeerId& id, std::uint64_t epoch, std::uint64_t seq) {
  PeerProgress p;
  p.epoch = epoch;
  p.seq = seq;
  p.ttl = 600s;
  std::lock_guard lk(hub.mu);
  hub.records[id] = {encode_progress(p), {Clock::now(), 600s}};
}

}  // namespace

TEST(LatePeer, ADownloadedPeerJoinsTheNextRoundWithoutTheFailedRoundsBackoff) {
  auto hub = std::make_shared<test::Hub>();
  test::IoThread io;
  auto collab = std::make_shared<test::GatedCollaboration>(hub, io.executor());
  const auto partner = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
  put_record(*hub, partner, 0, 1);
  auto o = test::delayed_options();
  o.delay_optimizer_step = false;  // synchronous rounds
  o.retry_backoff = 600s;          // longer than the test: a round held back never starts
  auto model = make_linear(1);
  auto opt = Optimizer::create(*model, test::GatedPeer::sgd(model), o, collab).value();
  ASSERT_TRUE(wait_until(
      [&] {
        const auto v = opt->status().collaboration;
        return v.num_peers == 2 && v.settled;
      },
      30s));
  torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(3);
  std::uint64_t fed_at_epoch = 0;  // samples fed since the last epoch change
  auto feed = [&] {
    auto [x, y] = batch(gen, 8);
    torch::mse_loss(model->forward(x), y).backward();
    const auto before = opt->local_epoch();
    auto r = opt->step();
    EXPECT_TRUE(r);
    fed_at_epoch = opt->local_epoch() == before ? fed_at_epoch + 8 : 0;
    return r ? r.value() : StepReport{};
  };

  // The round of epoch 0 fails (the partner "moved on" without this peer).
  collab->failures_to_inject = 1;
  collab->open();
  ASSERT_TRUE(wait_until(
      [&] {
        feed();
        return collab->finished == 1;
      },
      30s));
  EXPECT_EQ(opt->local_epoch(), 0u);
  // The partner is at epoch 1 and serves its state: this peer downloads it, and the samples it
  // computed toward epoch 0 are counted as dropped.
  auto donor = make_linear(7);
  torch::optim::SGD donor_opt(donor->parameters(), 0.05);
  const Bytes state = save_training_state(*donor, &donor_opt).value();
  {
    std::lock_guard lk(hub->mu);
    hub->providers[partner] = {io.executor(), [state]() -> awaitable<result<Collaboration::State>> {
                                 co_return Collaboration::State{1, state, 0};
                               }};
  }
  put_record(*hub, partner, 1, 2);
  std::uint64_t fed_before_download = 0;
  ASSERT_TRUE(wait_until(
      [&] {
        fed_before_download = fed_at_epoch + 8;
        feed();
        return opt->local_epoch() == 1;
      },
      30s));
  EXPECT_EQ(opt->status().state_downloads, 1u);
  EXPECT_EQ(opt->status().samples_dropped, fed_before_download);

  // At epoch 1 the peer reaches the target and averages with the partner at once.
  ASSERT_TRUE(wait_until(
      [&] {
        feed();
        return collab->started == 2 || fed_at_epoch >= 4 * o.target_batch_size;
      },
      30s));
  EXPECT_EQ(collab->started, 2) << "no round at epoch 1 after " << fed_at_epoch << " samples";
  ASSERT_TRUE(wait_until(
      [&] {
        feed();
        return opt->local_epoch() == 2;
      },
      30s));
  EXPECT_EQ(opt->status().rounds_ok, 1u);
  ASSERT_TRUE(opt->shutdown());
}
