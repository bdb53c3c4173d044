// Test support: checks on the outcome of a simulated round (round_sim.hpp).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "round_sim.hpp"

namespace starling::averaging::test {

// Checks every member that succeeded: bit-identical outputs, coverage tiles [0, N), and each
// range equals the weighted mean (in double) over its counted set. Returns the done members.
// expect_mean: every element is the weighted mean of the members counted there (false for
// CenteredClip, whose result is checked by its own tests).
inline std::vector<std::uint32_t> check_round(RoundSim& sim, bool expect_all_live_done = true,
                                              bool expect_mean = true) {
  std::vector<std::uint32_t> done;
  for (std::uint32_t i = 0; i < sim.n(); ++i) {
    if (sim.crashed(i)) continue;
    auto& c = sim.core(i);
    if (c.status() == RoundCore::Status::done) {
      done.push_back(i);
    } else if (expect_all_live_done) {
      ADD_FAILURE() << "member " << i << " did not finish: "
                    << (c.status() == RoundCore::Status::failed ? c.error().message()
                                                                : "still running in " + c.phase());
    }
  }
  if (done.empty()) return done;
  const auto& ref = sim.output(done[0]);
  for (auto i : done)
    EXPECT_EQ(std::memcmp(sim.output(i).data(), ref.data(), ref.size() * sizeof(float)), 0)
        << "member " << i << " differs from member " << done[0];
  const auto& cov = sim.core(done[0]).coverage();
  std::vector<Segment> segs;
  for (const auto& cv : cov) segs.push_back(cv.range);
  auto merged = merge_segments(segs);
  std::uint64_t total = 0;
  for (auto& s : segs) total += s.size();
  EXPECT_EQ(total, ref.size()) << "coverage overlaps or has holes";
  if (!ref.empty()) {
    EXPECT_EQ(merged, (std::vector<Segment>{{0, ref.size()}}));
  }
  for (const auto& cv : cov) {
    if (!expect_mean) break;
    double w = 0;
    for (auto j : cv.counted.indices()) w += sim.members()[j].weight;
    const double cnt = static_cast<double>(cv.counted.count());
    for (auto e = cv.range.begin; e < cv.range.end; ++e) {
      double want = 0;
      for (auto j : cv.counted.indices())
        want += (w > 0 ? sim.members()[j].weight / w : 1.0 / cnt) * sim.local(j)[e];
      if (std::abs(ref[e] - want) > 1e-5) {
        ADD_FAILURE() << "element " << e << " is " << ref[e] << ", want " << want << " counted "
                      << cv.counted.to_string();
        return done;
      }
    }
  }
  return done;
}

inline Bitset counted_anywhere(RoundSim& sim, std::uint32_t member) {
  Bitset b(sim.n());
  for (auto& cv : sim.core(member).coverage()) b |= cv.counted;
  return b;
}

// After a single crash, the victim's contribution is in every part of the result or in none
// (never in some parts only), and every survivor is counted everywhere.
inline void expect_all_or_nothing(RoundSim& sim, std::uint32_t victim,
                                  const std::vector<std::uint32_t>& done, std::size_t elems) {
  for (auto i : done) {
    const auto& ce = sim.core(i).counted_elements();
    EXPECT_TRUE(ce[victim] == 0 || ce[victim] == elems)
        << "member " << i << " counts the victim in " << ce[victim] << " of " << elems;
    for (std::uint32_t j = 0; j < sim.n(); ++j) {
      if (j != victim) {
        EXPECT_EQ(ce[j], elems) << "member " << i << " on survivor " << j;
      }
    }
  }
}

}  // namespace starling::averaging::test
