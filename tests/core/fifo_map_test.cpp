// FifoMap (core/fifo_map.hpp): holds at most its capacity, forgets the oldest inserted key
// first, and a repeated key neither moves nor evicts anything.
#include <gtest/gtest.h>

#include <string>

#include "starling/core/fifo_map.hpp"

using starling::FifoMap;

TEST(FifoMap, ForgetsTheOldestInsertedKeyFirst) {
  FifoMap<int, std::string> m(3);
  m[5] = "a";
  m[1] = "b";
  m[9] = "c";
  EXPECT_EQ(m.size(), 3u);
  m[1] = "b2";  // present: updated, no eviction, order unchanged
  EXPECT_EQ(m.size(), 3u);
  EXPECT_FALSE(m.try_emplace(9, "x").second);
  EXPECT_EQ(m.find(9)->second, "c");
  m[7] = "d";  // evicts 5, the oldest insertion (not the smallest key)
  EXPECT_EQ(m.size(), 3u);
  EXPECT_EQ(m.count(5), 0u);
  EXPECT_EQ(m.find(1)->second, "b2");
  m[0] = "e";  // evicts 1 although it was written after 9
  EXPECT_EQ(m.count(1), 0u);
  EXPECT_EQ(m.count(9), 1u);
  EXPECT_EQ(m.count(7), 1u);
  EXPECT_EQ(m.count(0), 1u);
}

TEST(FifoMap, StaysBoundedUnderAStreamOfNewKeys) {
  FifoMap<int, int> m(100);
  for (int i = 0; i < 10000; ++i) m.try_emplace(i, i);
  EXPECT_EQ(m.size(), 100u);
  EXPECT_EQ(m.begin()->first, 9900);  // the last 100 keys
  FifoMap<int, int> one(0);           // capacity 0 is treated as 1
  one[1] = 1;
  one[2] = 2;
  EXPECT_EQ(one.size(), 1u);
  EXPECT_EQ(one.count(2), 1u);
}
