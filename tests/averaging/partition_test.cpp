#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>

#include "starling/averaging/partition.hpp"
#include "starling/averaging/schema.hpp"

using namespace starling;
using namespace starling::averaging;

namespace {

__extension__ typedef unsigned __int128 u128;

// Exact cost of a split as a fraction num/den: max over non-clients of (N+(n-2)c)/b.
struct Frac {
  u128 num = 0, den = 1;
  bool operator<(const Frac& o) const { return num * o.den < o.num * den; }
  bool operator==(const Frac& o) const { return num * o.den == o.num * den; }
};

Frac exact_cost(std::uint64_t total, const std::vector<Capacity>& caps,
                const std::vector<std::uint64_t>& c) {
  const std::uint64_t n = caps.size();
  const std::uint64_t m = n >= 2 ? n - 2 : 0;
  Frac worst{0, 1};
  for (std::size_t i = 0; i < caps.size(); ++i) {
    if (caps[i].client) continue;
    Frac f{u128{total} + u128{m} * c[i], caps[i].bandwidth};
    if (worst < f) worst = f;
  }
  return worst;
}

// Minimum cost over every integer split among the non-clients.
Frac brute_force(std::uint64_t total, const std::vector<Capacity>& caps) {
  std::vector<std::size_t> reducers;
  for (std::size_t i = 0; i < caps.size(); ++i)
    if (!caps[i].client) reducers.push_back(i);
  std::vector<std::uint64_t> c(caps.size(), 0);
  Frac best{~u128{0} >> 1, 1};
  std::function<void(std::size_t, std::uint64_t)> rec = [&](std::size_t k, std::uint64_t left) {
    if (k + 1 == reducers.size()) {
      c[reducers[k]] = left;
      auto f = exact_cost(total, caps, c);
      if (f < best) best = f;
      return;
    }
    for (std::uint64_t x = 0; x <= left; ++x) {
      c[reducers[k]] = x;
      rec(k + 1, left - x);
    }
  };
  rec(0, total);
  return best;
}

}  // namespace

TEST(Partition, MatchesBruteForceOnSmallCases) {
  std::mt19937_64 rng(1234);
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t reducers = 1 + rng() % 4;
    const std::size_t clients = rng() % 3;
    std::vector<Capacity> caps;
    for (std::size_t i = 0; i < reducers + clients; ++i) caps.push_back({1 + rng() % 20, false});
    for (std::size_t i = 0; i < clients; ++i) caps[rng() % caps.size()].client = true;
    if (std::all_of(caps.begin(), caps.end(), [](auto& c) { return c.client; }))
      caps[0].client = false;
    const std::uint64_t total = rng() % 40;
    auto shares = optimal_shares(total, caps);
    ASSERT_TRUE(shares) << shares.error().message();
    const auto& c = shares.value();
    ASSERT_EQ(std::accumulate(c.begin(), c.end(), std::uint64_t{0}), total);
    for (std::size_t i = 0; i < caps.size(); ++i) {
      if (caps[i].client) {
        EXPECT_EQ(c[i], 0u);
      }
    }
    EXPECT_TRUE(exact_cost(total, caps, c) == brute_force(total, caps)) << "trial " << trial;
  }
}

TEST(Partition, AgreesWithBisectionOnTheContinuousOptimum) {
  // Independent method: bisection on T; at time T member i can take (T b_i - N)/(n-2).
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 100; ++trial) {
    const std::size_t n = 3 + rng() % 14;
    std::vector<Capacity> caps;
    for (std::size_t i = 0; i < n; ++i) caps.push_back({1000 + rng() % 1000000, rng() % 5 == 0});
    caps[rng() % n].client = false;
    const std::uint64_t total = 10'000'000 + rng() % 1000;
    auto c = optimal_shares(total, caps).value();
    const double N = static_cast<double>(total), m = static_cast<double>(n - 2);
    double lo = 0, hi = 1e9;
    for (int it = 0; it < 200; ++it) {
      const double t = (lo + hi) / 2;
      double cap = 0;
      for (auto& k : caps)
        if (!k.client) cap += std::max(0.0, (t * static_cast<double>(k.bandwidth) - N) / m);
      (cap >= N ? hi : lo) = t;
    }
    // Every member moves at least N per direction, so N / b_i bounds the round from below
    // whatever the split; the optimum is the larger of that and the water level.
    for (auto& k : caps)
      if (!k.client) hi = std::max(hi, N / static_cast<double>(k.bandwidth));
    const double ours = round_time(total, caps, c);
    EXPECT_GE(ours, hi * (1 - 1e-9));
    // Integer rounding adds at most one element to one member.
    double slack = 0;
    for (auto& k : caps)
      if (!k.client) slack = std::max(slack, m / static_cast<double>(k.bandwidth));
    EXPECT_LE(ours, hi + slack + 1e-9 * hi) << "trial " << trial;
  }
}

TEST(Partition, ShapeOfTheSolution) {
  // Equal bandwidths: equal shares (within one element).
  std::vector<Capacity> eq(5, Capacity{100, false});
  auto c = optimal_shares(1003, eq).value();
  for (auto x : c) EXPECT_TRUE(x == 200 || x == 201) << x;
  // A member 100x slower than the rest owns nothing when the group is large.
  std::vector<Capacity> slow(8, Capacity{1000, false});
  slow[3].bandwidth = 10;
  c = optimal_shares(1'000'000, slow).value();
  EXPECT_EQ(c[3], 0u);
  // Twice the bandwidth: more than the others.
  std::vector<Capacity> fast(4, Capacity{1000, false});
  fast[0].bandwidth = 2000;
  c = optimal_shares(1'000'000, fast).value();
  EXPECT_GT(c[0], c[1]);
  EXPECT_EQ(c[1], c[2]);
  // Two members: proportional to bandwidth.
  std::vector<Capacity> two{{300, false}, {100, false}};
  c = optimal_shares(1000, two).value();
  EXPECT_EQ(c[0], 750u);
  EXPECT_EQ(c[1], 250u);
  // Clients own nothing; a group of one reducer and clients gives it everything.
  std::vector<Capacity> cl{{10, true}, {1, false}, {10, true}};
  c = optimal_shares(77, cl).value();
  EXPECT_EQ(c, (std::vector<std::uint64_t>{0, 77, 0}));
}

TEST(Partition, Errors) {
  std::vector<Capacity> clients{{10, true}, {10, true}};
  EXPECT_EQ(optimal_shares(10, clients).error(), errc::unavailable);
  std::vector<Capacity> zero{{0, false}};
  EXPECT_EQ(optimal_shares(10, zero).error(), errc::invalid_argument);
  std::vector<Capacity> one{{10, false}};
  EXPECT_EQ(optimal_shares(std::uint64_t{1} << 60, one).error(), errc::too_large);
}

TEST(Partition, PlanCoversSegmentsInBoundedParts) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t n = 1 + rng() % 10;
    std::vector<Capacity> caps;
    for (std::size_t i = 0; i < n; ++i) caps.push_back({1 + rng() % 50, rng() % 4 == 0});
    caps[rng() % n].client = false;
    Bitset active(n, true);
    for (std::size_t i = 0; i < n; ++i)
      if (caps[i].client && rng() % 2) active.reset(i);
    std::vector<Segment> segs;
    std::uint64_t pos = rng() % 5;
    for (int s = 0, k = static_cast<int>(rng() % 4); s <= k; ++s) {
      const std::uint64_t len = rng() % 300;
      segs.push_back({pos, pos + len});
      pos += len + 1 + rng() % 20;
    }
    const std::size_t part = 1 + rng() % 64;
    auto plan = make_plan(segs, caps, active, part).value();
    // Parts in order tile the segments exactly; each owner's parts are contiguous in order.
    std::vector<Segment> covered;
    std::uint32_t last_owner = 0;
    for (const auto& p : plan.parts) {
      EXPECT_GT(p.size(), 0u);
      EXPECT_LE(p.size(), part);
      EXPECT_FALSE(caps[p.owner].client);
      EXPECT_TRUE(active.test(p.owner));
      EXPECT_GE(p.owner, last_owner);
      last_owner = p.owner;
      covered.push_back({p.begin, p.end});
    }
    EXPECT_EQ(merge_segments(covered), merge_segments(segs));
    std::uint64_t sum = 0;
    for (auto& p : plan.parts) sum += p.size();
    EXPECT_EQ(sum, plan.total);
  }
}

TEST(Schema, HashDependsOnEverything) {
  Schema a{{{"w", {2, 3}, DType::f32}, {"b", {3}, DType::f32}}, "none"};
  EXPECT_TRUE(validate_schema(a));
  EXPECT_EQ(a.numel(), 9u);
  auto h = schema_hash(a);
  EXPECT_EQ(h.size(), kSchemaHashSize);
  EXPECT_EQ(schema_hash(a), h);
  Schema b = a;
  b.tensors[0].shape = {3, 2};
  EXPECT_NE(schema_hash(b), h);
  b = a;
  b.codec = "uint8";
  EXPECT_NE(schema_hash(b), h);
  b = a;
  b.tensors[1].name = "c";
  EXPECT_NE(schema_hash(b), h);
  b = a;
  std::swap(b.tensors[0], b.tensors[1]);
  EXPECT_NE(schema_hash(b), h);
  Schema dup{{{"w", {1}, DType::f32}, {"w", {1}, DType::f32}}, "none"};
  EXPECT_FALSE(validate_schema(dup));
  Schema neg{{{"w", {-1}, DType::f32}}, "none"};
  EXPECT_FALSE(validate_schema(neg));
}

TEST(Schema, GatherScatterAcrossTensorBoundaries) {
  std::vector<float> a{1, 2, 3}, b{4, 5}, c{6, 7, 8, 9};
  std::vector<TensorView> views{{"a", a}, {"b", b}, {"c", c}};
  std::vector<float> out(5);
  gather_flat(views, 2, out);
  EXPECT_EQ(out, (std::vector<float>{3, 4, 5, 6, 7}));
  std::vector<float> in{30, 40, 50, 60, 70};
  scatter_flat(views, 2, in);
  EXPECT_EQ(a, (std::vector<float>{1, 2, 30}));
  EXPECT_EQ(b, (std::vector<float>{40, 50}));
  EXPECT_EQ(c, (std::vector<float>{60, 70, 8, 9}));
  Schema s{{{"a", {3}, DType::f32}, {"b", {2}, DType::f32}, {"c", {4}, DType::f32}}, "none"};
  EXPECT_TRUE(check_views(s, views));
  s.tensors[2].shape = {5};
  EXPECT_FALSE(check_views(s, views));
}

TEST(Bitset, EncodeDecode) {
  Bitset b(13);
  b.set(0);
  b.set(12);
  b.set(7);
  auto enc = b.encode();
  EXPECT_EQ(enc.size(), 2u);
  EXPECT_EQ(Bitset::decode(enc, 13).value(), b);
  EXPECT_FALSE(Bitset::decode(enc, 17));  // wrong length
  Bytes high{0x00, 0x80};                 // bit 15 set beyond n = 13
  EXPECT_FALSE(Bitset::decode(high, 13));
  EXPECT_EQ((~b).count(), 10u);
}
