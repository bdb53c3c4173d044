// The gradient check's draw of targets (averaging/grad_check.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "starling/averaging/grad_check.hpp"

namespace starling::averaging::acct {
namespace {

Hash32 seed_of(std::uint32_t i) {
  Hash32 s{};
  for (int b = 0; b < 4; ++b) s[b] = static_cast<std::uint8_t>(i >> (8 * b));
  return s;
}

TEST(GradCheckDraw, DistinctSortedInRangeAndDeterministic) {
  for (std::uint32_t i = 0; i < 200; ++i) {
    const auto t = grad_check_targets(seed_of(i), 7, 3);
    ASSERT_EQ(t.size(), 3u);
    EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
    EXPECT_EQ(std::adjacent_find(t.begin(), t.end()), t.end());
    for (auto m : t) EXPECT_LT(m, 7u);
    EXPECT_EQ(t, grad_check_targets(seed_of(i), 7, 3));
  }
  EXPECT_EQ(grad_check_targets(seed_of(1), 4, 9), (std::vector<std::uint32_t>{0, 1, 2, 3}));
  EXPECT_TRUE(grad_check_targets(seed_of(1), 4, 0).empty());
  EXPECT_TRUE(grad_check_targets(seed_of(1), 0, 2).empty());
}

TEST(GradCheckDraw, EveryMemberIsDrawnAboutEquallyOften) {
  // 7000 seeds, 2 of 7 drawn: each member 2000 times in expectation (sd ~38).
  std::vector<int> hits(7);
  for (std::uint32_t i = 0; i < 7000; ++i)
    for (auto m : grad_check_targets(seed_of(i), 7, 2)) ++hits[m];
  for (int h : hits) {
    EXPECT_GT(h, 2000 - 200);
    EXPECT_LT(h, 2000 + 200);
  }
  // Another seed, another draw (most of the time).
  int same = 0;
  for (std::uint32_t i = 0; i < 100; ++i)
    same += grad_check_targets(seed_of(i), 7, 2) == grad_check_targets(seed_of(i + 1000), 7, 2);
  EXPECT_LT(same, 30);
}

}  // namespace
}  // namespace starling::averaging::acct
