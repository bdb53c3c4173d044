// Delayed parameter updates (OptimizerOptions::delay_optimizer_step) over a gated test double:
// the round and the step run in the background while step() keeps returning, the finished
// step is applied by a later step() and equals the synchronous step, a failed background
// round gives its gradients back and is retried, and shutdown during a round is bounded.
#include <gtest/gtest.h>

#include <algorithm>

#include "optim/gated_peer.hpp"
#include "support/temp_dir.hpp"

using namespace starling;
using namespace starling::optim;
using namespace starling::training;

using test::batch;
using test::delayed_options;
using test::digest_of;
using test::flat_params;
using test::GatedPeer;
using test::make_linear;
using test::mean_gradient;
using test::reference_step;
using test::wait_until;

// The round in flight never blocks the loop, even when the peer computes several targets'
// worth of samples before it ends (before: step() waited for it once this peer alone had a
// whole target). The next round carries every sample computed meanwhile, weighted by them.
TEST(DelayedUpdates, LoopNeverWaitsForTheRoundInFlightAndTheNextRoundCarriesTheBacklog) {
  GatedPeer p;
  ASSERT_TRUE(wait_until([&] { return p.knows_partner(); }, 30s));
  for (int i = 0; i < 8; ++i) p.feed();  // 64 samples: the round of epoch 0 starts
  ASSERT_TRUE(wait_until([&] { return p.collab->started == 1; }, 30s));
  // Three targets' worth of batches with the gate closed, each call bounded.
  Duration slowest{0};
  for (int i = 0; i < 24; ++i) {
    const auto t0 = Clock::now();
    auto r = p.feed();
    slowest = std::max(slowest, Clock::now() - t0);
    EXPECT_FALSE(r.stepped);
    EXPECT_TRUE(r.round_in_background);
    EXPECT_EQ(r.epoch, 0u);
  }
  EXPECT_LT(slowest, 5s) << "step() waited for the round in flight";
  EXPECT_LT(p.opt->status().step_time, 10s);
  EXPECT_EQ(p.collab->finished, 0);
  // The gate opens: step 1 is applied, and the next call starts round 1 with the backlog.
  p.collab->open();
  ASSERT_TRUE(wait_until([&] { return p.collab->finished == 1; }, 30s));
  std::size_t second_launch = 0;  // batches fed when round 1 started
  const auto until = Clock::now() + 30s;
  while (second_launch == 0 && Clock::now() < until) {
    auto r = p.feed();
    if (r.round_in_background && p.opt->local_epoch() == 1) second_launch = p.batches.size();
  }
  ASSERT_GE(second_launch, 8u + 24u + 1u);
  ASSERT_TRUE(wait_until([&] { return p.collab->started == 2; }, 30s));
  EXPECT_DOUBLE_EQ(p.collab->last_weight, 8.0 * static_cast<double>(second_launch - 8));
  StepReport r;
  ASSERT_TRUE(wait_until(
      [&] {
        r = p.feed();
        return p.opt->local_epoch() == 2;
      },
      30s));
  EXPECT_DOUBLE_EQ(r.group_samples, 2 * 8.0 * static_cast<double>(second_launch - 8));
  // Two SGD steps: epoch 0's gradients at the initial parameters, then the backlog's gradients,
  // each at the parameters it was computed on (most one step stale).
  const auto p1 = p.params_at[0] - 0.05 * mean_gradient(p, 0, 8);
  const auto p2 = p1 - 0.05 * mean_gradient(p, 8, second_launch);
  EXPECT_TRUE(torch::allclose(flat_params(*p.model), p2, 1e-5, 1e-6));
  ASSERT_TRUE(p.opt->shutdown());
}

TEST(DelayedUpdates, StepRunsInBackgroundWhileTheLoopContinues) {
  GatedPeer p;
  ASSERT_TRUE(wait_until([&] { return p.knows_partner(); }, 30s));
  const auto initial = flat_params(*p.model);
  // 64 samples reach the target: the 8th call starts the round in the background.
  for (int i = 0; i < 8; ++i) {
    auto r = p.feed();
    EXPECT_FALSE(r.stepped);
    EXPECT_EQ(r.round_in_background, i == 7) << i;
  }
  ASSERT_TRUE(wait_until([&] { return p.collab->started == 1; }, 30s));
  // The loop is not blocked: with the round waiting at the gate, step() keeps returning, on
  // the same (now one step stale) parameters, toward the next epoch.
  for (int i = 0; i < 4; ++i) {
    auto r = p.feed();
    EXPECT_FALSE(r.stepped);
    EXPECT_TRUE(r.round_in_background);
    EXPECT_EQ(r.epoch, 0u);
    EXPECT_TRUE(torch::equal(flat_params(*p.model), initial));
  }
  p.collab->open();
  ASSERT_TRUE(wait_until([&] { return p.collab->finished == 1; }, 30s));
  // The finished step is applied by the next call: exactly the synchronous step on the 64
  // samples of epoch 0.
  auto applied = p.feed();
  ASSERT_TRUE(wait_until(
      [&] {
        if (applied.stepped) return true;
        applied = p.feed();
        return applied.stepped;
      },
      30s));
  EXPECT_EQ(applied.epoch, 1u);
  EXPECT_EQ(applied.group_size, 2u);
  EXPECT_TRUE(torch::allclose(flat_params(*p.model), reference_step(p.batches, 8), 1e-5, 1e-6));
  // The 4+ batches computed meanwhile count toward epoch 1.
  EXPECT_GE(p.opt->status().local_samples, 32u);
  ASSERT_TRUE(p.opt->shutdown());
}

TEST(DelayedUpdates, FailedBackgroundRoundGivesItsGradientsBackAndIsRetried) {
  GatedPeer p;
  p.collab->failures_to_inject = 1;
  p.collab->open();
  ASSERT_TRUE(wait_until([&] { return p.knows_partner(); }, 30s));
  const auto initial = flat_params(*p.model);
  bool failed = false;
  std::size_t second_launch = 0;  // batches fed when the retried round started
  StepReport r;
  const auto until = Clock::now() + 60s;
  while (Clock::now() < until) {
    r = p.feed();
    if (r.round_error) {
      EXPECT_FALSE(r.stepped);
      EXPECT_EQ(r.epoch, 0u);
      failed = true;
      advance_clock(OptimizerOptions{}.retry_backoff);  // the backoff passes at once
    }
    if (failed && r.round_in_background && second_launch == 0) second_launch = p.batches.size();
    if (r.stepped) break;
    if (second_launch == 0) {
      EXPECT_TRUE(torch::equal(flat_params(*p.model), initial));
    }
    std::this_thread::sleep_for(2ms);  // pacing
  }
  ASSERT_TRUE(failed);
  ASSERT_TRUE(r.stepped);
  EXPECT_EQ(r.epoch, 1u);
  EXPECT_EQ(p.collab->started, 2);
  // Every gradient computed before the retried round (all on the initial parameters) is in
  // the step: the failed round's samples were given back, not lost.
  EXPECT_TRUE(
      torch::allclose(flat_params(*p.model), reference_step(p.batches, second_launch), 1e-5, 1e-6));
  ASSERT_TRUE(p.opt->shutdown());
}

TEST(DelayedUpdates, ShutdownDuringABackgroundRoundIsBounded) {
  GatedPeer p;
  ASSERT_TRUE(wait_until([&] { return p.knows_partner(); }, 30s));
  for (int i = 0; i < 8; ++i) p.feed();
  ASSERT_TRUE(wait_until([&] { return p.collab->started == 1; }, 30s));
  const auto t0 = Clock::now();
  (void)p.opt->shutdown(2s);  // the round (60 s timeout) is cancelled
  EXPECT_LT(Clock::now() - t0, 15s);
  EXPECT_EQ(p.opt->local_epoch(), 0u);
}

// Rounds that keep failing never make a peer step alone while a live peer is at its epoch;
// once it is really alone (the partner's record expired by its ttl), it steps on its own.
TEST(DelayedUpdates, RepeatedFailuresStepAloneOnlyWhenReallyAlone) {
  GatedPeer p;
  p.collab->failures_to_inject = 1000;
  p.collab->open();
  ASSERT_TRUE(wait_until([&] { return p.knows_partner(); }, 30s));
  int errors = 0;
  const auto until = Clock::now() + 60s;
  while (errors < 4 && Clock::now() < until) {
    auto r = p.feed();
    if (r.round_error) {
      ++errors;
      advance_clock(OptimizerOptions{}.retry_backoff);
    }
    EXPECT_FALSE(r.stepped);
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_EQ(errors, 4);  // more than kMaxFailedRounds
  EXPECT_EQ(p.opt->local_epoch(), 0u);
  // The partner goes away: its last record lives 1 s.
  {
    PeerProgress partner;
    partner.seq = 2;
    partner.ttl = 1s;
    std::lock_guard lk(p.hub->mu);
    for (auto& [id, v] : p.hub->records)
      if (id != p.collab->self()) v = {encode_progress(partner), {Clock::now(), 1s}};
  }
  bool stepped = false;
  const auto until2 = Clock::now() + 60s;
  while (!stepped && Clock::now() < until2) {
    auto r = p.feed();
    if (r.stepped) {
      stepped = true;
      EXPECT_EQ(r.group_size, 1u);
    }
    std::this_thread::sleep_for(2ms);
    advance_clock(20ms);  // the clock runs 10x faster: the record's expiry and the holds pass
  }
  EXPECT_TRUE(stepped);
  EXPECT_EQ(p.opt->local_epoch(), 1u);
}

// DelayCorrection::predict: after a step the model holds the collaboration's parameters
// extrapolated by that step (p + (p - previous p)); the gradients of the next round are taken
// there, and the next step applies them to p itself. The collaboration's state (the digest,
// evaluation through with_collaboration_parameters, checkpoints, the parameters after
// finish_round/shutdown) is p, never the prediction. Reference: two SGD steps computed here.
TEST(DelayedUpdates, PredictComputesGradientsAtTheExtrapolatedParameters) {
  test::TempDir dir("delayed-predict");
  GatedPeer p(DelayCorrection::predict, dir.path);
  ASSERT_TRUE(wait_until([&] { return p.knows_partner(); }, 30s));
  const auto p0 = flat_params(*p.model);
  for (int i = 0; i < 8; ++i) p.feed();  // the round of epoch 0 starts
  ASSERT_TRUE(wait_until([&] { return p.collab->started == 1; }, 30s));
  for (int i = 0; i < 3; ++i) p.feed();  // no step known yet: gradients at p0
  p.collab->open();
  ASSERT_TRUE(wait_until([&] { return p.collab->finished == 1; }, 30s));
  // Feed until step 1 is applied and round 1 (the backlog) has started.
  const auto [first_applied, second_launch] = p.feed_until_second_round();
  ASSERT_GT(first_applied, 0u);
  ASSERT_GE(second_launch, first_applied);
  const auto p1 = p0 - 0.05 * mean_gradient(p, 0, 8);
  const auto predicted1 = p1 + (p1 - p0);
  // Every batch before the step was applied was computed at p0, and the model now holds the
  // prediction; the collaboration's state is p1.
  for (std::size_t i = 0; i < first_applied; ++i) EXPECT_TRUE(torch::equal(p.params_at[i], p0));
  EXPECT_TRUE(torch::allclose(flat_params(*p.model), predicted1, 1e-5, 1e-6));
  torch::Tensor seen;
  p.opt->with_collaboration_parameters([&] { seen = flat_params(*p.model); });
  EXPECT_TRUE(torch::allclose(seen, p1, 1e-5, 1e-6));
  EXPECT_EQ(p.opt->state_digest(), digest_of(seen));
  EXPECT_TRUE(torch::allclose(flat_params(*p.model), predicted1, 1e-5, 1e-6))
      << "the prediction is restored after with_collaboration_parameters";
  // Round 1 carries the backlog (batches 8..second_launch): those fed after the step was
  // applied were computed at the prediction. Step 2 applies their mean gradient to p1.
  p.collab->open();
  StepReport r;
  ASSERT_TRUE(wait_until(
      [&] {
        r = p.feed();
        return p.opt->local_epoch() == 2;
      },
      30s));
  const auto p2 = p1 - 0.05 * mean_gradient(p, 8, second_launch);
  EXPECT_TRUE(torch::allclose(flat_params(*p.model), p2 + (p2 - p1), 1e-5, 1e-6));
  // A checkpoint written now (the model holding the prediction) holds p2.
  ASSERT_TRUE(p.opt->save_checkpoint());
  EXPECT_TRUE(torch::allclose(flat_params(*p.model), p2 + (p2 - p1), 1e-5, 1e-6));
  {
    auto resumed = make_linear(99);
    auto o = delayed_options(DelayCorrection::predict);
    o.checkpoint_dir = dir.path;
    o.delay_optimizer_step = false;
    auto alone = Optimizer::create(
                     *resumed, std::make_unique<torch::optim::SGD>(resumed->parameters(), 0.05), o)
                     .value();
    ASSERT_TRUE(alone->resumed_from());
    EXPECT_EQ(alone->local_epoch(), 2u);
    EXPECT_TRUE(torch::allclose(flat_params(*resumed), p2, 1e-5, 1e-6));
  }
  // Leaving: the model ends at p2.
  p.opt->finish_round();
  EXPECT_TRUE(torch::allclose(flat_params(*p.model), p2, 1e-5, 1e-6));
  ASSERT_TRUE(p.opt->shutdown());
  EXPECT_TRUE(torch::allclose(flat_params(*p.model), p2, 1e-5, 1e-6));
}

// delay_max_backlog: once this peer has computed its share of the bound (1 target / 2 peers =
// 32 samples, 4 batches) during a round, step() waits for that round and returns with its step
// applied; without the bound it returns at once (LoopNeverWaits... above).
TEST(DelayedUpdates, BoundedBacklogWaitsForTheRoundInFlight) {
  GatedPeer p(DelayCorrection::local, {}, GatedPeer::sgd,
              [](OptimizerOptions& o) { o.delay_max_backlog = 1; });
  ASSERT_TRUE(wait_until([&] { return p.knows_partner(); }, 30s));
  for (int i = 0; i < 8; ++i) p.feed();  // the round of epoch 0 starts
  ASSERT_TRUE(wait_until([&] { return p.collab->started == 1; }, 30s));
  std::atomic<int> calls{0}, returned{0};
  std::atomic<bool> fourth_stepped{false};
  std::thread feeder([&] {
    for (int i = 1; i <= 8; ++i) {
      ++calls;
      auto r = p.feed();
      if (i == 4) fourth_stepped = r.stepped;
      ++returned;
    }
  });
  ASSERT_TRUE(wait_until([&] { return calls >= 4; }, 30s));
  // The 4th call holds the loop while the round is in flight (the gate is closed).
  EXPECT_FALSE(wait_until([&] { return returned >= 4; }, 2s)) << "step() did not wait";
  EXPECT_EQ(returned, 3);
  p.collab->open();
  feeder.join();
  EXPECT_TRUE(fourth_stepped) << "the call that waited applies the round's step";
  EXPECT_EQ(p.opt->local_epoch(), 1u);
  ASSERT_TRUE(p.opt->shutdown());
}
