// BeamSearchCore against exhaustive search over full and sparse grids.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "starling/moe/beam_search.hpp"

namespace starling::moe {
namespace {

using Coords = std::vector<std::uint32_t>;

// Drives the core against an in-memory set of alive experts, counting prefix fetches.
std::size_t run(BeamSearchCore& core, const std::string& grid, const std::vector<Coords>& alive) {
  std::size_t fetches = 0;
  for (int round = 0; round < 100 && !core.advance(); ++round) {
    auto want = core.wanted();
    EXPECT_FALSE(want.empty());
    for (const auto& prefix : want) {
      ++fetches;
      std::set<std::uint32_t> kids;
      for (const auto& c : alive)
        for (std::size_t n = 0; n < c.size(); ++n) {
          if (core.prefix_of(Coords(c.begin(), c.begin() + n)) == prefix) kids.insert(c[n]);
        }
      core.provide(prefix, {kids.begin(), kids.end()});
    }
  }
  EXPECT_TRUE(core.done());
  (void)grid;
  return fetches;
}

void check_case(std::mt19937& rng, std::size_t dims, std::uint32_t side, double keep,
                std::size_t samples, std::size_t k) {
  std::vector<Coords> alive;
  Coords cur(dims, 0);
  std::bernoulli_distribution alive_d(keep);
  for (;;) {
    if (alive_d(rng)) alive.push_back(cur);
    std::size_t d = dims;
    bool wrapped = true;
    while (d > 0) {
      --d;
      if (++cur[d] < side) {
        wrapped = false;
        break;
      }
      cur[d] = 0;
    }
    if (wrapped) break;
  }
  std::normal_distribution<float> nd;
  std::vector<std::vector<std::vector<float>>> scores(samples);
  for (auto& s : scores) {
    s.resize(dims);
    for (auto& v : s) {
      v.resize(side);
      for (auto& x : v) x = nd(rng);
    }
  }
  BeamSearchCore core("g", scores, k);
  run(core, "g", alive);
  for (std::size_t i = 0; i < samples; ++i) {
    auto want = exhaustive_top_k(scores[i], alive, k);
    const auto& got = core.results()[i];
    ASSERT_EQ(got.size(), want.size()) << "dims " << dims << " alive " << alive.size();
    EXPECT_EQ(got.size(), std::min(k, alive.size()));
    std::set<Coords> seen;
    for (std::size_t j = 0; j < got.size(); ++j) {
      EXPECT_NEAR(got[j].score, want[j].score, 1e-5) << "rank " << j;
      EXPECT_TRUE(seen.insert(got[j].coords).second) << "duplicate choice";
      EXPECT_NE(std::find(alive.begin(), alive.end(), got[j].coords), alive.end())
          << "chose a dead expert";
    }
  }
}

TEST(MoeBeamSearch, FullGridsMatchExhaustive) {
  std::mt19937 rng(7);
  for (std::size_t dims = 1; dims <= 4; ++dims)
    for (std::size_t k : {1, 3, 8}) check_case(rng, dims, dims <= 2 ? 6 : 4, 1.0, 5, k);
}

TEST(MoeBeamSearch, SparseGridsMatchExhaustive) {
  std::mt19937 rng(11);
  for (int rep = 0; rep < 10; ++rep)
    for (std::size_t dims = 1; dims <= 3; ++dims)
      for (double keep : {0.05, 0.3, 0.7}) check_case(rng, dims, 5, keep, 4, 4);
}

TEST(MoeBeamSearch, FewerAliveThanKReturnsAllAlive) {
  std::vector<Coords> alive{{1, 2}, {3, 0}};
  std::vector<std::vector<std::vector<float>>> scores{{{0, 1, 2, 3}, {3, 2, 1, 0}}};
  BeamSearchCore core("g", scores, 5);
  run(core, "g", alive);
  ASSERT_EQ(core.results()[0].size(), 2u);
  EXPECT_EQ(core.results()[0][0].coords, (Coords{3, 0}));
  EXPECT_FLOAT_EQ(core.results()[0][0].score, 6.0f);
}

TEST(MoeBeamSearch, NothingAliveFinishesEmpty) {
  std::vector<std::vector<std::vector<float>>> scores{{{0, 1}, {1, 0}}, {{2, 1}, {0, 0}}};
  BeamSearchCore core("g", scores, 2);
  auto fetches = run(core, "g", {});
  EXPECT_EQ(fetches, 1u);  // "g." fetched once for the whole batch
  EXPECT_TRUE(core.results()[0].empty());
  EXPECT_TRUE(core.results()[1].empty());
}

TEST(MoeBeamSearch, SharesPrefixFetchesAcrossTheBatch) {
  std::vector<Coords> alive;
  for (std::uint32_t a = 0; a < 4; ++a)
    for (std::uint32_t b = 0; b < 4; ++b) alive.push_back({a, b});
  std::vector<std::vector<std::vector<float>>> scores(32, {{1, 0, 0, 0}, {0, 0, 0, 1}});
  BeamSearchCore core("g", scores, 1);
  auto fetches = run(core, "g", alive);
  EXPECT_EQ(fetches, 2u);  // "g." and "g.0."
  for (const auto& r : core.results()) {
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].coords, (Coords{0, 3}));
  }
}

TEST(MoeBeamSearch, IgnoresOutOfRangeChildrenAndBoundsExpansions) {
  std::vector<std::vector<std::vector<float>>> scores{{{0, 1}, {1, 0}}};
  BeamSearchCore core("g", scores, 3, 2);
  core.advance();
  core.provide("g.", {0, 1, 999999});
  core.advance();
  for (const auto& p : core.wanted()) core.provide(p, {0, 1, 7});
  for (int i = 0; i < 10 && !core.advance(); ++i)
    for (const auto& p : core.wanted()) core.provide(p, {0, 1});
  EXPECT_TRUE(core.done());
  for (const auto& c : core.results()[0]) {
    EXPECT_LT(c.coords[0], 2u);
    EXPECT_LT(c.coords[1], 2u);
  }
}

}  // namespace
}  // namespace starling::moe
