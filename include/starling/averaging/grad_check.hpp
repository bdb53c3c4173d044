// Gradient check by validators (issue 20 item 2c; docs/security.md "Gradient check"): which
// members a round's members re-compute, and what an owner hands its caller to check. The
// re-computation itself needs the model and the data (torch): the averager only draws the
// targets from the round's seed and returns, per target, the values of that member it holds
// (the parts it owns, signed by the member's part receipts). No I/O; pure functions.
//
// Threading rule: plain values and functions, callable from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "starling/averaging/accountability.hpp"
#include "starling/averaging/types.hpp"

namespace starling::averaging {

// A target member's values for a range of the flat vector [offset, offset + values.size()).
struct ContributionSlice {
  std::uint64_t offset = 0;
  std::vector<float> values;
};

// What this member holds of one target's contribution after a round: the target, the weight
// it declared (its samples), the group's median declared weight (bounds the validator's cost)
// and its values on the parts this member owns.
struct ContributionSample {
  PeerKey peer;
  double weight = 0;
  double median_weight = 0;
  std::vector<ContributionSlice> slices;
};

namespace acct {

// The members every member of a round checks: `k` distinct indices in [0, members), drawn
// from BLAKE2b("starling/grad-check/v1" || seed). The seed is the round's (round_seed over
// every member's committed nonce), so no single member chooses the targets, and no member
// knows them before the all-gather is over. k >= members: everyone, in index order.
std::vector<std::uint32_t> grad_check_targets(const Hash32& seed, std::uint32_t members,
                                              std::uint32_t k);

}  // namespace acct
}  // namespace starling::averaging
