// The wait before a networked peer's first round (ProgressConfig::startup_grace_min): it adapts
// to how long this peer's first record took to publish, between startup_grace_min and
// startup_grace; stepping alone still waits for the whole startup_grace; the fetch that
// settles the view begins as soon as it may. Simulated time.
#include <gtest/gtest.h>

#include "progress_support.hpp"

using namespace starling;
using namespace starling::training;
using progress_support::config;
using progress_support::make_peer;
using progress_support::rec;
using progress_support::t0;

namespace {

ProgressConfig grace_config(Duration min) {
  auto cfg = config(100);
  cfg.confirm_alone = true;
  cfg.startup_grace = 2s;
  cfg.startup_grace_min = min;
  cfg.grace_per_publish = 10;
  return cfg;
}

// A tracker started at t0() with its own samples and three peers' records at epoch 0 (the
// target reached), its first record published in `took`.
ProgressTracker started(Duration min, std::optional<Duration> took) {
  ProgressTracker t(make_peer(), grace_config(min));
  t.start(t0());
  t.report_samples(100, 1s);
  for (int i = 0; i < 3; ++i) t.observe(make_peer(), rec(0, 50, 10, 2), 0s, t0());
  if (took) t.publish_took(*took);
  return t;
}

// Whether a round may start at t0() + at after a fetch that began then.
bool round_after_fetch_at(ProgressTracker& t, Duration at) {
  t.fetched(t0() + at, t.epoch_generation());
  return t.decide(t0() + at + 1ms).action == Action::average_and_step;
}

}  // namespace

TEST(StartupGrace, AFastPublicationSettlesTheViewAtTheMinimum) {
  auto t = started(500ms, 10ms);  // 10 x 10 ms is below the minimum: 500 ms
  EXPECT_FALSE(round_after_fetch_at(t, 400ms));
  EXPECT_TRUE(round_after_fetch_at(t, 500ms));
  EXPECT_TRUE(t.view(t0() + 501ms).settled);
}

TEST(StartupGrace, TheWaitGrowsWithThePublicationAndStopsAtTheGrace) {
  auto slow = started(500ms, 150ms);  // 1.5 s
  EXPECT_FALSE(round_after_fetch_at(slow, 1400ms));
  EXPECT_TRUE(round_after_fetch_at(slow, 1500ms));
  auto slower = started(500ms, 1s);  // 10 s, bounded by the 2 s grace
  EXPECT_FALSE(round_after_fetch_at(slower, 1900ms));
  EXPECT_TRUE(round_after_fetch_at(slower, 2s));
}

TEST(StartupGrace, FixedGraceWithoutAMinimumOrBeforeThePublication) {
  auto fixed = started(Duration::zero(), 10ms);  // startup_grace_min 0: the fixed 2 s
  EXPECT_FALSE(round_after_fetch_at(fixed, 1900ms));
  EXPECT_TRUE(round_after_fetch_at(fixed, 2s));
  auto unpublished = started(500ms, std::nullopt);  // no publication timed yet: 2 s
  EXPECT_FALSE(round_after_fetch_at(unpublished, 1900ms));
  // Only the first publication counts: a later, faster one does not shorten the wait.
  auto first = started(500ms, 150ms);
  first.publish_took(1ms);
  EXPECT_FALSE(round_after_fetch_at(first, 1400ms));
}

TEST(StartupGrace, SteppingAloneStillWaitsForTheWholeGrace) {
  ProgressTracker t(make_peer(), grace_config(500ms));
  t.start(t0());
  t.report_samples(100, 1s);
  t.publish_took(10ms);
  t.fetched(t0() + 600ms, t.epoch_generation());  // nobody else: settled, alone not confirmed
  EXPECT_EQ(t.decide(t0() + 600ms).action, Action::accumulate);
  t.fetched(t0() + 2s, t.epoch_generation());
  EXPECT_EQ(t.decide(t0() + 2s).action, Action::step_alone);
}

TEST(StartupGrace, TheSettlingFetchBeginsAsSoonAsItMay) {
  auto t = started(500ms, 10ms);
  t.fetched(t0() + 10ms, t.epoch_generation());
  // The next fetch is due when the view may settle (no later), then at once if it is past.
  EXPECT_LE(t.next_fetch(t0() + 400ms), 100ms);
  EXPECT_EQ(t.next_fetch(t0() + 700ms), Duration::zero());
  // Settled: the usual interval again (at least min_refresh).
  t.fetched(t0() + 700ms, t.epoch_generation());
  EXPECT_GE(t.next_fetch(t0() + 800ms), t.config().min_refresh);
}

// Processes start unevenly: a peer first seen after the others (it started later) moves the
// moment the view settles to the time its record was written plus the adapted wait, so peers
// started with it are in the first round too; at most startup_grace after start(), and not after a
// step.
TEST(StartupGrace, ALatePeerExtendsTheWaitUntilItsPeersCanBeSeen) {
  auto t = started(500ms, 10ms);                               // settles at 500 ms
  t.observe(make_peer(), rec(0, 0, 10, 1), 0s, t0() + 300ms);  // first seen at 300 ms
  EXPECT_FALSE(round_after_fetch_at(t, 700ms));
  EXPECT_TRUE(round_after_fetch_at(t, 800ms));
  // A record written at 20 ms, first fetched at 600 ms: not a late start, nothing moves.
  auto fetched_late = started(500ms, 10ms);
  fetched_late.observe(make_peer(), rec(0, 0, 10, 1), 580ms, t0() + 600ms);
  EXPECT_TRUE(round_after_fetch_at(fetched_late, 600ms));
  auto bounded = started(500ms, 10ms);
  bounded.observe(make_peer(), rec(0, 0, 10, 1), 0s, t0() + 1800ms);  // 2.3 s, bounded at 2 s
  EXPECT_FALSE(round_after_fetch_at(bounded, 1900ms));
  EXPECT_TRUE(round_after_fetch_at(bounded, 2s));
  // After this peer's first step, a newcomer at the old epoch changes nothing.
  auto stepped = started(500ms, 10ms);
  EXPECT_TRUE(round_after_fetch_at(stepped, 500ms));
  stepped.set_epoch(1);
  stepped.report_samples(100, 1s);
  for (int i = 0; i < 3; ++i) stepped.observe(make_peer(), rec(1, 50, 10, 3), 0s, t0() + 600ms);
  stepped.observe(make_peer(), rec(0, 0, 10, 1), 0s, t0() + 600ms);
  EXPECT_EQ(stepped.decide(t0() + 601ms).action, Action::average_and_step);
}
