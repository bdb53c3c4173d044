// RoundBudget: advice once rounds dominate, nothing when they do not, suggestions that would
// bring the share under the bound (checked against the same model of a round's cost).
#include <gtest/gtest.h>

#include "starling/training/round_budget.hpp"

using namespace starling;
using namespace starling::training;
using namespace std::chrono_literals;

namespace {

void feed(RoundBudget& b, int rounds, Duration round, Duration compute, std::uint64_t samples) {
  for (int i = 0; i < rounds; ++i) {
    b.computed(compute, samples);
    b.round(round);
  }
}

TEST(RoundBudget, SilentBeforeEnoughRoundsAndWhenRoundsAreCheap) {
  RoundBudget b(1024, 64, false, 20, 0.3);
  feed(b, 19, 30ms, 10ms, 256);
  EXPECT_FALSE(b.advice()) << "judged before 20 rounds";
  RoundBudget cheap(1024, 64, false, 20, 0.3);
  feed(cheap, 40, 10ms, 100ms, 256);
  EXPECT_FALSE(cheap.advice()) << "rounds are 9% of the time";
}

TEST(RoundBudget, SynchronousRoundsThatDominateGetATargetAndDilocoThatFixIt) {
  RoundBudget b(1024, 64, false, 20, 0.3);
  feed(b, 20, 30ms, 10ms, 256);  // 4 batches of 64 per round on this peer
  auto a = b.advice();
  ASSERT_TRUE(a);
  EXPECT_NEAR(a->round_share, 0.75, 1e-9);
  // At m x the target each round computes m x 10 ms: the suggestion must bring 30 / (30 + m 10)
  // to at most 0.3, i.e. m >= 7: the next power of two is 8.
  EXPECT_EQ(a->suggested_target, 8192u);
  const double m = static_cast<double>(a->suggested_target) / 1024;
  EXPECT_LE(30.0 / (30.0 + m * 10.0), 0.3);
  // DiLoCo: 2.5 ms per local batch, a round every H batches: 30 / (30 + 2.5 H) <= 0.3.
  EXPECT_LE(30.0 / (30.0 + 2.5 * a->suggested_diloco_steps), 0.3 + 1e-9);
  EXPECT_GT(30.0 / (30.0 + 2.5 * (a->suggested_diloco_steps - 1)), 0.3);
  EXPECT_NE(a->message.find("8192"), std::string::npos) << a->message;
  EXPECT_FALSE(b.advice()) << "advice is given once";
}

TEST(RoundBudget, DelayedRoundsDominateOnlyWhenSlowerThanComputing) {
  RoundBudget ok(1024, 64, true, 20, 0.3);
  feed(ok, 20, 30ms, 40ms, 256);
  EXPECT_FALSE(ok.advice()) << "a round that fits in the next epoch's computing is hidden";
  RoundBudget slow(1024, 64, true, 20, 0.3);
  feed(slow, 20, 50ms, 20ms, 256);
  auto a = slow.advice();
  ASSERT_TRUE(a);
  EXPECT_NEAR(a->round_share, 2.5, 1e-9);
  EXPECT_EQ(a->suggested_target, 4096u);  // 50 <= m 20 with m a power of two
}

}  // namespace
