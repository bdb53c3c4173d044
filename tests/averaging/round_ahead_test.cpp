// RoundCore: messages for the next sub-round are held until it starts, counted exactly
// (held_bytes()), and bounded per peer by what it could legitimately send in one sub-round.
#include <gtest/gtest.h>

#include "starling/averaging/round_core.hpp"

using namespace starling;
using namespace starling::averaging;

namespace {

struct Core {
  std::vector<float> local = std::vector<float>(1000, 1.0f), out = std::vector<float>(1000);
  std::vector<float> data = std::vector<float>(1000, 0.5f);
  TimePoint now = TimePoint{} + 1h;
  RoundCore core;
  Core()
      : core(std::vector<RoundMember>(3, RoundMember{{100, false}, 1.0}), 0, local, out,
             RoundConfig{.part_elems = 100}, now, now + 60s) {
    EXPECT_TRUE(core.start(now));
  }
  result<void> part(std::uint32_t from, std::uint32_t idx, std::size_t floats) {
    return core.on_message(from, PartMsg{1, idx, std::span(data).first(floats), 1.0}, now);
  }
};

}  // namespace

TEST(RoundAhead, HeldBytesAreExact) {
  Core c;
  const auto per = RoundCore::held_per_message();
  EXPECT_EQ(c.core.held_bytes(), 0u);
  ASSERT_TRUE(c.part(1, 0, 50));
  EXPECT_EQ(c.core.held_bytes(), per + 50 * sizeof(float));
  ASSERT_TRUE(c.part(2, 0, 70));
  EXPECT_EQ(c.core.held_bytes(), 2 * per + 120 * sizeof(float));
  ResultMsg r{1, 3, Bitset(3, true), std::span(c.data).first(10)};
  ASSERT_TRUE(c.core.on_message(1, r, c.now));
  EXPECT_EQ(c.core.held_bytes(), 3 * per + 130 * sizeof(float) + 1);
  FinReport rep{1, Bitset(20), Bitset(3), Bitset(3), Bitset(3, true)};
  ASSERT_TRUE(c.core.on_message(1, FinMsg{1, 1, {rep}}, c.now));
  EXPECT_EQ(c.core.held_bytes(),
            4 * per + 130 * sizeof(float) + 1 + sizeof(FinReport) + (20 + 9 + 7) / 8);
  c.core.abandon(Error(errc::cancelled, "test"));
  EXPECT_EQ(c.core.held_bytes(), 0u) << "a finished core holds nothing";
}

TEST(RoundAhead, RepeatsAreRejected) {
  Core c;
  ASSERT_TRUE(c.part(1, 4, 10));
  const auto held = c.core.held_bytes();
  EXPECT_FALSE(c.part(1, 4, 10)) << "the same part twice";
  EXPECT_TRUE(c.core.failed().test(1));
  EXPECT_EQ(c.core.held_bytes(), held);
  FinReport rep{2, Bitset(5), Bitset(3), Bitset(3), Bitset(3, true)};
  ASSERT_TRUE(c.core.on_message(2, FinMsg{1, 2, {rep}}, c.now));
  EXPECT_FALSE(c.core.on_message(2, FinMsg{1, 2, {rep}}, c.now)) << "a second fin2";
  EXPECT_TRUE(c.core.failed().test(2));
}

TEST(RoundAhead, APeerCannotRunAheadByMoreThanOneVector) {
  Core c;
  // 1000 floats of parts is the most any sender could owe in a sub-round: the first ten
  // parts of 100 are accepted, the eleventh is not.
  for (std::uint32_t p = 0; p < 10; ++p) ASSERT_TRUE(c.part(1, p, 100)) << p;
  const auto held = c.core.held_bytes();
  EXPECT_EQ(held, 10 * (RoundCore::held_per_message() + 400));
  auto r = c.part(1, 10, 1);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::too_large);
  EXPECT_TRUE(c.core.failed().test(1));
  // Empty payloads never count as progress (they would be free to repeat).
  EXPECT_FALSE(c.part(2, 0, 0));
}
