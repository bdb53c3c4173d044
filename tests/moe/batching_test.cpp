// BatchScheduler: min/max batch, max wait, oldest-first across experts.
#include <gtest/gtest.h>

#include "starling/moe/batching.hpp"

namespace starling::moe {
namespace {

const TimePoint t0 = TimePoint{} + std::chrono::hours(1);

TEST(MoeBatching, WaitsForMinBatchOrMaxWait) {
  BatchScheduler s;
  PoolConfig cfg;
  cfg.min_batch = 4;
  cfg.max_batch = 8;
  cfg.max_wait = 10ms;
  auto p = s.add_pool(cfg);
  EXPECT_FALSE(s.next_wakeup());
  ASSERT_TRUE(s.push(p, 1, t0));
  ASSERT_TRUE(s.push(p, 2, t0 + 1ms));
  EXPECT_FALSE(s.next(t0 + 2ms));  // 3 rows < 4, oldest waited 2ms
  EXPECT_EQ(s.next_wakeup(), t0 + 10ms);
  EXPECT_FALSE(s.next(t0 + 9ms));
  auto b = s.next(t0 + 10ms);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->rows, 3u);
  EXPECT_EQ(b->tasks.size(), 2u);
  EXPECT_EQ(s.queued_tasks(), 0u);
  EXPECT_FALSE(s.next_wakeup());

  ASSERT_TRUE(s.push(p, 2, t0 + 20ms));
  ASSERT_TRUE(s.push(p, 2, t0 + 21ms));
  EXPECT_EQ(s.next_wakeup(), TimePoint::min());  // 4 rows: ready now
  b = s.next(t0 + 21ms);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->rows, 4u);
}

TEST(MoeBatching, MaxBatchSplitsInArrivalOrderAndRefusesHugeTasks) {
  BatchScheduler s;
  PoolConfig cfg;
  cfg.min_batch = 1;
  cfg.max_batch = 5;
  auto p = s.add_pool(cfg);
  EXPECT_FALSE(s.push(p, 6, t0));
  EXPECT_FALSE(s.push(p, 0, t0));
  auto a = s.push(p, 3, t0).value();
  auto b = s.push(p, 3, t0 + 1ms).value();
  auto c = s.push(p, 2, t0 + 2ms).value();
  auto x = s.next(t0 + 3ms);
  ASSERT_TRUE(x);
  EXPECT_EQ(x->tasks, std::vector<BatchScheduler::TaskId>{a});  // 3 + 3 > 5
  x = s.next(t0 + 3ms);
  ASSERT_TRUE(x);
  EXPECT_EQ(x->tasks, (std::vector<BatchScheduler::TaskId>{b, c}));
  EXPECT_EQ(x->rows, 5u);
  EXPECT_FALSE(s.next(t0 + 3ms));
}

TEST(MoeBatching, OldestFirstAcrossExperts) {
  BatchScheduler s;
  PoolConfig cfg;
  cfg.min_batch = 1;
  auto p0 = s.add_pool(cfg);
  auto p1 = s.add_pool(cfg);
  auto p2 = s.add_pool(cfg);
  s.push(p1, 1, t0);
  s.push(p2, 1, t0 + 1ms);
  s.push(p0, 1, t0 + 2ms);
  s.push(p1, 1, t0 + 3ms);
  std::vector<std::size_t> order;
  while (auto b = s.next(t0 + 5ms)) order.push_back(b->pool);
  // p1's oldest task goes first and takes p1's later task with it.
  EXPECT_EQ(order, (std::vector<std::size_t>{p1, p2, p0}));
}

TEST(MoeBatching, ReadyPoolBeatsOlderWaitingPool) {
  BatchScheduler s;
  PoolConfig slow;
  slow.min_batch = 10;
  slow.max_wait = 100ms;
  PoolConfig fast;
  fast.min_batch = 1;
  auto ps = s.add_pool(slow);
  auto pf = s.add_pool(fast);
  s.push(ps, 1, t0);
  s.push(pf, 1, t0 + 1ms);
  auto b = s.next(t0 + 2ms);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->pool, pf);
  EXPECT_FALSE(s.next(t0 + 2ms));
  EXPECT_EQ(s.next_wakeup(), t0 + 100ms);
  b = s.next(t0 + 100ms);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->pool, ps);
}

TEST(MoeBatching, RemoveDropsQueuedTask) {
  BatchScheduler s;
  PoolConfig cfg;
  cfg.min_batch = 3;
  auto p = s.add_pool(cfg);
  auto a = s.push(p, 2, t0).value();
  s.push(p, 1, t0);
  EXPECT_TRUE(s.remove(a));
  EXPECT_FALSE(s.remove(a));
  EXPECT_EQ(s.queued_rows(p), 1u);
  EXPECT_FALSE(s.next(t0));
}

}  // namespace
}  // namespace starling::moe
