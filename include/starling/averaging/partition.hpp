// Partitioning for butterfly all-reduce: which member owns (reduces) which elements of the
// flattened vector, and how owned ranges are cut into parts that move independently.
//
// Cost model. n senders each hold N elements; member i owns c_i of them (sum c_i = N; clients
// own 0). In reduce-scatter i sends its N - c_i non-owned elements and receives (n-1)*c_i; in
// all-gather it sends (n-1)*c_i and receives N - c_i. Per direction the traffic of i is
// N + (n-2)*c_i, so with full-duplex links of declared bandwidth b_i the round takes
//     T(c) = max_i (N + (n-2) * c_i) / b_i.
// optimal_shares() minimises T exactly over integers: the continuous optimum is a
// water-filling (the k fastest members are active, each with time T*; a member with
// b_i * (n-2+k) <= sum of the top-k bandwidths gets nothing), computed in 128-bit integer
// arithmetic so that every member derives the same counts; the leftover elements of the
// floor rounding are then handed out one at a time to the member whose time grows least,
// which is optimal for a min-max of increasing separable costs. For n <= 2 every split costs
// the same and shares are proportional to bandwidth. Client times (N / b_i) do not depend on
// the split and are ignored.
//
// Threading rule: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "starling/averaging/types.hpp"
#include "starling/core/result.hpp"

namespace starling::averaging {

struct Capacity {
  std::uint64_t bandwidth = 1;  // bytes/s (any unit, only ratios matter), 1 .. 2^40
  bool client = false;
};

// Element counts per member (same order as `members`), summing to `total`. `active`, if
// given, marks which members take part (others neither send nor own). Errors: no active
// non-client member, bandwidth out of range, more than kMaxGroupSize members, total > 2^50.
result<std::vector<std::uint64_t>> optimal_shares(std::uint64_t total,
                                                  std::span<const Capacity> members,
                                                  const Bitset* active = nullptr);

// T(c) of the cost model above in seconds-per-unit (for tests and logs). Members outside
// `active` are ignored; n = number of active members.
double round_time(std::uint64_t total, std::span<const Capacity> members,
                  std::span<const std::uint64_t> shares, const Bitset* active = nullptr);

// A contiguous run of the flattened vector.
struct Segment {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t size() const noexcept { return end - begin; }
  friend bool operator==(const Segment&, const Segment&) = default;
};

// One part: elements [begin, end) reduced by `owner`.
struct PartSpec {
  std::uint32_t owner = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t size() const noexcept { return end - begin; }
  friend bool operator==(const PartSpec&, const PartSpec&) = default;
};

// The parts of one (sub-)round, ordered by position in the concatenation of the segments.
struct RoundPlan {
  std::vector<PartSpec> parts;
  std::vector<std::uint64_t> owned;  // elements owned per member
  std::uint64_t total = 0;
};

inline constexpr std::size_t kDefaultPartElems = (1u << 20) / sizeof(float);  // 1 MiB parts

// Splits the concatenation of `segments` among the active non-client members with
// optimal_shares() (in member order: member 0 gets the first c_0 elements, ...), then cuts
// each owner's run into parts of at most `part_elems` elements (a run crossing a segment
// boundary is cut there too). Deterministic: every member computes the same plan.
result<RoundPlan> make_plan(std::span<const Segment> segments, std::span<const Capacity> members,
                            const Bitset& active, std::size_t part_elems = kDefaultPartElems);

// Merges a sorted list of parts' ranges into maximal segments.
std::vector<Segment> merge_segments(std::vector<Segment> segs);

}  // namespace starling::averaging
