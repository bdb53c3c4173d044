#include "starling/training/round_budget.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace starling::training {

RoundBudget::RoundBudget(std::uint64_t target_batch, std::uint64_t batch_size, bool delayed,
                         std::size_t min_rounds, double max_share)
    : target_(std::max<std::uint64_t>(1, target_batch)),
      batch_(std::max<std::uint64_t>(1, batch_size)),
      delayed_(delayed),
      min_rounds_(std::max<std::size_t>(1, min_rounds)),
      max_share_(std::clamp(max_share, 0.01, 0.99)) {}

void RoundBudget::computed(Duration d, std::uint64_t samples) {
  compute_s_ += std::chrono::duration<double>(d).count();
  samples_ += samples;
}

void RoundBudget::round(Duration d) {
  ++rounds_;
  round_s_ += std::chrono::duration<double>(d).count();
}

std::optional<RoundAdvice> RoundBudget::advice() {
  if (given_ || rounds_ < min_rounds_ || compute_s_ <= 0) return std::nullopt;
  given_ = true;
  RoundAdvice a;
  const auto n = static_cast<double>(rounds_);
  a.round_seconds = round_s_ / n;
  a.compute_seconds = compute_s_ / n;
  a.round_share = delayed_ ? a.round_seconds / a.compute_seconds
                           : a.round_seconds / (a.round_seconds + a.compute_seconds);
  const double limit = delayed_ ? 1.0 : max_share_;
  if (a.round_share <= limit) return std::nullopt;
  // A round costs about the same at any target batch: at m times the target each round
  // computes m times as much. Synchronous: r / (r + m c) <= share  <=>  m >= r (1 - s) / (s c).
  // Delayed: r <= m c.
  const double m = delayed_ ? a.round_seconds / a.compute_seconds
                            : a.round_seconds * (1 - max_share_) / (max_share_ * a.compute_seconds);
  std::uint64_t mult = 1;
  while (static_cast<double>(mult) < m && mult < (1u << 20)) mult *= 2;
  a.suggested_target = target_ * mult;
  // DiLoCo: a round every H local batches of this peer; the same bound with c per batch.
  const double per_batch =
      compute_s_ / std::max(1.0, static_cast<double>(samples_) / static_cast<double>(batch_));
  const double h = delayed_ ? a.round_seconds / per_batch
                            : a.round_seconds * (1 - max_share_) / (max_share_ * per_batch);
  a.suggested_diloco_steps =
      static_cast<std::uint32_t>(std::clamp(std::ceil(h - 1e-9), 2.0, 10000.0));
  a.message = fmt::format(
      "averaging rounds dominate: {:.0f} ms per round against {:.0f} ms of computing per epoch "
      "on this peer ({:.0f}% of the time{}). A larger --target-batch-size (about {}) or DiLoCo "
      "(--diloco-steps {}) would keep rounds under {:.0f}%; see docs/training.md, choosing the "
      "target batch",
      a.round_seconds * 1e3, a.compute_seconds * 1e3, 100 * a.round_share,
      delayed_ ? " of the computing, the rounds overlap it" : "", a.suggested_target,
      a.suggested_diloco_steps, 100 * (delayed_ ? 1.0 : max_share_));
  return a;
}

}  // namespace starling::training
