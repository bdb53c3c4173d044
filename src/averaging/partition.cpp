#include "starling/averaging/partition.hpp"

#include <algorithm>
#include <numeric>

namespace starling::averaging {
namespace {

__extension__ typedef unsigned __int128 u128;

constexpr std::uint64_t kMaxBandwidth = std::uint64_t{1} << 40;
constexpr std::uint64_t kMaxTotal = std::uint64_t{1} << 50;

// Hands out `left` units to `pool` members: each to the member whose cost
// (N + m*(c_i+1)) / b_i is smallest (ties: lower index). With m == 0 all costs are equal and
// this degenerates to lowest-index-first, so callers handle n <= 2 by largest remainder.
void greedy_fill(std::uint64_t total, std::uint64_t m, std::span<const Capacity> members,
                 const std::vector<std::size_t>& pool, std::vector<std::uint64_t>& c,
                 std::uint64_t left) {
  for (; left > 0; --left) {
    std::size_t best = pool.front();
    u128 best_num = u128{total} + u128{m} * (c[best] + 1);
    for (std::size_t i : pool) {
      const u128 num = u128{total} + u128{m} * (c[i] + 1);
      // num / b_i < best_num / b_best  <=>  num * b_best < best_num * b_i
      const u128 lhs = num * members[best].bandwidth;
      const u128 rhs = best_num * members[i].bandwidth;
      if (lhs < rhs || (lhs == rhs && i < best)) {
        best = i;
        best_num = num;
      }
    }
    ++c[best];
  }
}

}  // namespace

result<std::vector<std::uint64_t>> optimal_shares(std::uint64_t total,
                                                  std::span<const Capacity> members,
                                                  const Bitset* active) {
  if (members.size() > kMaxGroupSize)
    return make_error(errc::too_large, "partition: " + std::to_string(members.size()) + " members");
  if (total > kMaxTotal) return make_error(errc::too_large, "partition: more than 2^50 elements");
  if (active && active->size() != members.size())
    return make_error(errc::invalid_argument, "partition: active mask size mismatch");
  std::vector<std::size_t> reducers;
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (active && !active->test(i)) continue;
    if (members[i].bandwidth == 0 || members[i].bandwidth > kMaxBandwidth)
      return make_error(errc::invalid_argument,
                        "partition: member " + std::to_string(i) + " bandwidth out of range");
    ++n;
    if (!members[i].client) reducers.push_back(i);
  }
  if (reducers.empty())
    return make_error(errc::unavailable, "partition: no active non-client member to own a share");

  std::vector<std::uint64_t> c(members.size(), 0);
  if (n <= 2) {
    // Every split costs the same: proportional to bandwidth, largest remainder.
    u128 sum_b = 0;
    for (auto i : reducers) sum_b += members[i].bandwidth;
    std::uint64_t given = 0;
    std::vector<std::pair<u128, std::size_t>> rem;
    for (auto i : reducers) {
      const u128 num = u128{total} * members[i].bandwidth;
      c[i] = static_cast<std::uint64_t>(num / sum_b);
      given += c[i];
      rem.emplace_back(num % sum_b, i);
    }
    std::stable_sort(rem.begin(), rem.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (std::size_t j = 0; given < total; ++j, ++given) ++c[rem[j % rem.size()].second];
    return c;
  }

  // Water-filling over reducers sorted by bandwidth (descending, ties by index).
  std::vector<std::size_t> order = reducers;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return members[a].bandwidth > members[b].bandwidth;
  });
  const std::uint64_t m = n - 2;
  std::size_t k = 0;
  u128 bk = 0;
  {
    u128 prefix = 0;
    for (std::size_t j = 0; j < order.size(); ++j) {
      prefix += members[order[j]].bandwidth;
      // member j+1 (1-based k = j+1) active iff b * (m + k) > B_k; monotone in k.
      if (u128{members[order[j]].bandwidth} * (m + j + 1) > prefix) {
        k = j + 1;
        bk = prefix;
      } else {
        break;
      }
    }
  }
  const u128 den = u128{m} * bk;
  std::uint64_t given = 0;
  for (std::size_t j = 0; j < k; ++j) {
    const std::size_t i = order[j];
    const u128 num = u128{total} * (u128{members[i].bandwidth} * (m + k) - bk);
    c[i] = static_cast<std::uint64_t>(num / den);
    given += c[i];
  }
  greedy_fill(total, m, members, reducers, c, total - given);
  return c;
}

double round_time(std::uint64_t total, std::span<const Capacity> members,
                  std::span<const std::uint64_t> shares, const Bitset* active) {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < members.size(); ++i)
    if (!active || active->test(i)) ++n;
  const double m = n >= 2 ? static_cast<double>(n - 2) : 0.0;
  double t = 0;
  for (std::size_t i = 0; i < members.size(); ++i) {
    if ((active && !active->test(i)) || members[i].client) continue;
    const double traffic = static_cast<double>(total) + m * static_cast<double>(shares[i]);
    t = std::max(t, traffic / static_cast<double>(members[i].bandwidth));
  }
  return t;
}

std::vector<Segment> merge_segments(std::vector<Segment> segs) {
  std::sort(segs.begin(), segs.end(),
            [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
  std::vector<Segment> out;
  for (const auto& s : segs) {
    if (s.size() == 0) continue;
    if (!out.empty() && s.begin <= out.back().end)
      out.back().end = std::max(out.back().end, s.end);
    else
      out.push_back(s);
  }
  return out;
}

result<RoundPlan> make_plan(std::span<const Segment> segments, std::span<const Capacity> members,
                            const Bitset& active, std::size_t part_elems) {
  if (part_elems == 0) return make_error(errc::invalid_argument, "partition: part size 0");
  RoundPlan plan;
  for (const auto& s : segments) {
    if (s.end < s.begin) return make_error(errc::invalid_argument, "partition: reversed segment");
    plan.total += s.size();
  }
  ST_TRY(auto shares, optimal_shares(plan.total, members, &active));
  plan.owned = shares;
  std::size_t seg = 0;
  std::uint64_t seg_pos = segments.empty() ? 0 : segments[0].begin;
  for (std::size_t owner = 0; owner < members.size(); ++owner) {
    std::uint64_t left = shares[owner];
    while (left > 0) {
      while (seg_pos == segments[seg].end) {
        ++seg;
        seg_pos = segments[seg].begin;
      }
      const std::uint64_t take =
          std::min<std::uint64_t>({left, segments[seg].end - seg_pos, part_elems});
      plan.parts.push_back({static_cast<std::uint32_t>(owner), seg_pos, seg_pos + take});
      seg_pos += take;
      left -= take;
    }
  }
  return plan;
}

}  // namespace starling::averaging
