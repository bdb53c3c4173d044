// RoundRunner: the gradient check's share of the round (grad_check.hpp, docs/security.md
// "Gradient check"). Once the reveals gave the round's seed, the targets are drawn from it;
// for each target other than this member, the values it sent for the parts this member owns
// (kept by RoundAcct for the owners' answers, signed by the target's part receipts) go to the
// caller, which re-computes the target's gradient and compares.
#include <algorithm>

#include "round_runner.hpp"
#include "starling/core/log.hpp"

namespace starling::averaging::detail {

void RoundRunner::collect_grad_samples(const std::vector<SettledPart>& settled) {
  const std::uint32_t k = cfg_.acct ? cfg_.acct->grad_check_targets : 0;
  if (!acct_ || k == 0 || !acct_->have_reveals()) return;
  std::vector<double> weights;
  for (std::uint32_t j = 0; j < n_; ++j)
    if (core_.weight_of(j) > 0) weights.push_back(core_.weight_of(j));  // auxiliary peers: 0
  std::sort(weights.begin(), weights.end());
  const double median = weights.empty() ? 0 : weights[weights.size() / 2];
  for (const std::uint32_t c : acct::grad_check_targets(acct_->seed(), n_, k)) {
    if (c == self_ || !(core_.weight_of(c) > 0)) continue;
    ContributionSample s;
    s.peer = group_.members[c].peer;
    s.weight = core_.weight_of(c);
    s.median_weight = median;
    for (const auto& p : settled) {
      if (p.owner != self_ || !p.counted.test(c)) continue;
      const auto* kept = acct_->kept(p.subround, p.part);
      std::size_t rank = 0;
      for (std::uint32_t j = 0; j < c; ++j) rank += p.counted.test(j) ? 1 : 0;
      if (!kept || rank >= kept->size() || (*kept)[rank].size() != p.range.size()) continue;
      s.slices.push_back({p.range.begin, (*kept)[rank]});
    }
    if (!s.slices.empty()) grad_samples_.push_back(std::move(s));
  }
  if (!grad_samples_.empty())
    logger("averaging")
        ->debug("gradient check: member {} holds values of {} target(s)", self_,
                grad_samples_.size());
}

}  // namespace starling::averaging::detail
