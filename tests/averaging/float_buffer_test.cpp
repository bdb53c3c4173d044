#include <gtest/gtest.h>

#include "starling/averaging/float_buffer.hpp"

using namespace starling::averaging;

TEST(FloatBuffer, LargeBlocksAreRecycledSmallOnesAreNot) {
  const std::size_t n = (kRecycleMin / sizeof(float)) * 3 + 7;  // an unusual size
  const std::size_t before = buffer_cache_bytes();
  const float* first = nullptr;
  {
    FloatBuffer a(n);
    first = a.data();
    a[n - 1] = 1.0f;
  }
  EXPECT_EQ(buffer_cache_bytes(), before + n * sizeof(float));
  FloatBuffer b(n);  // the same size: the same block again
  EXPECT_EQ(b.data(), first);
  EXPECT_EQ(buffer_cache_bytes(), before);
  { FloatBuffer small(16); }
  EXPECT_EQ(buffer_cache_bytes(), before);
}

TEST(FloatBuffer, CacheIsBounded) {
  const std::size_t n = (kRecycleCapacity / sizeof(float)) / 2 + 1;  // two exceed the cap
  {
    FloatBuffer a(n), b(n);
    a.back() = b.back() = 2.0f;
  }
  EXPECT_LE(buffer_cache_bytes(), kRecycleCapacity);
  FloatBuffer c(n);  // takes the cached one back
  EXPECT_LE(buffer_cache_bytes(), kRecycleCapacity);
}
