// UploadPacer (round_runner.hpp): the token bucket a round's writers share. Pure: time is a
// parameter.
#include <gtest/gtest.h>

#include "averaging/round_runner.hpp"

using namespace starling;
using starling::averaging::detail::UploadPacer;

TEST(UploadPacer, BurstPassesThenTheRateHolds) {
  UploadPacer p;
  p.rate = 1'000'000;  // bytes/s
  p.burst = 64 * 1024;
  const TimePoint t0 = Clock::now();
  EXPECT_EQ(p.take(64 * 1024, t0), Duration::zero()) << "the first burst goes at once";
  // The next 100 kB at the same instant wait 100 ms; two writers' bookings queue up.
  const auto w1 = p.take(100'000, t0);
  const auto w2 = p.take(100'000, t0);
  EXPECT_NEAR(std::chrono::duration<double>(w1).count(), 0.1, 1e-6);
  EXPECT_NEAR(std::chrono::duration<double>(w2).count(), 0.2, 1e-6);
  // After a long idle time only one burst's worth is free again (the bucket does not grow).
  const TimePoint later = t0 + std::chrono::seconds(10);
  EXPECT_EQ(p.take(64 * 1024, later), Duration::zero());
  EXPECT_GT(p.take(1000, later), Duration::zero());
  // Over a long run the writers never exceed the rate: 10 MB in 1 kB pieces take ~10 s.
  UploadPacer q;
  q.rate = 1'000'000;
  q.burst = 64 * 1024;
  TimePoint now = t0;
  for (int i = 0; i < 10'000; ++i) now += q.take(1000, now);
  const double took = std::chrono::duration<double>(now - t0).count();
  EXPECT_NEAR(took, 10.0 - 0.065536, 0.01);
}

TEST(UploadPacer, OffWithoutARate) {
  UploadPacer p;
  EXPECT_EQ(p.take(std::size_t{1} << 30, Clock::now()), Duration::zero());
}
