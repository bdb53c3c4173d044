// RoundRunner's balanced progress (round_runner.hpp): the writers share this member's uplink,
// and a writer whose flow is ahead of the slowest flow with data ready holds back a little.
#include "round_runner.hpp"

#include "starling/core/log.hpp"

namespace starling::averaging::detail {

void RoundRunner::balance_plan() {
  if (core_.subround() == balance_sub_) return;
  balance_sub_ = core_.subround();
  const bool i_am_client = group_.members[self_].client;
  for (auto& P : p_) P.flow_total = P.flow_sent = P.parts_total = 0;
  for (const auto& part : core_.plan().parts) {
    if (part.owner != self_) {
      p_[part.owner].flow_total += part.size();  // our values of its part
      p_[part.owner].parts_total += part.size();
      continue;
    }
    for (std::uint32_t j = 0; j < n_; ++j)  // our result to everyone we talk to
      if (j != self_ && !(i_am_client && group_.members[j].client)) p_[j].flow_total += part.size();
  }
}

bool RoundRunner::balance_ahead(std::uint32_t j) const {
  const auto& P = p_[j];
  if (cfg_.round.balance_slack == 0 || P.flow_total == 0) return false;
  double slowest = 1.0;
  bool any = false;
  for (std::uint32_t k = 0; k < n_; ++k) {
    const auto& Q = p_[k];
    if (k == j || k == self_ || Q.fenced || !Q.send || Q.flow_total == 0 ||
        Q.flow_sent >= Q.flow_total || (Q.queue.empty() && !Q.busy))
      continue;  // no flow, done, or nothing ready to send: not held back by the link
    slowest = std::min(slowest, static_cast<double>(Q.flow_sent) / Q.flow_total);
    any = true;
  }
  const double lead = static_cast<double>(P.flow_sent) - slowest * P.flow_total;
  return any && lead > static_cast<double>(cfg_.round.balance_slack * cfg_.round.part_elems);
}

void RoundRunner::log_flow(std::uint32_t j, std::uint64_t before) const {
  const auto& P = p_[j];
  const char* what = nullptr;
  if (before < P.parts_total && P.flow_sent >= P.parts_total) what = "parts";
  if (before < P.flow_total && P.flow_sent >= P.flow_total) what = "parts and results";
  if (!what) return;
  logger("averaging")
      ->debug(
          "all-reduce: member {} sent its {} to {} after {} ms", self_, what, j,
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started_).count());
}

}  // namespace starling::averaging::detail
