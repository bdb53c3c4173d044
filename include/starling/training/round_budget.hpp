// RoundBudget: whether averaging rounds dominate a trainer's time, and what to change. A trainer
// reports the time it spent computing gradients and each completed round's time (matchmaking
// plus all-reduce); after enough rounds, advice() says once whether the rounds take more than a
// share of the time and suggests a target batch size (the round's cost stays about the same
// while each epoch computes more) or DiLoCo local steps that would bring them under it.
//
// Threading rule: plain value, one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "starling/core/clock.hpp"

namespace starling::training {

struct RoundAdvice {
  double round_seconds = 0;    // mean over the rounds seen
  double compute_seconds = 0;  // this peer's computing per round (mean)
  double round_share = 0;      // synchronous: round / (round + compute); delayed: round / compute
  std::uint64_t suggested_target = 0;
  std::uint32_t suggested_diloco_steps = 0;
  std::string message;
};

class RoundBudget {
 public:
  // `delayed`: rounds overlap computing (they dominate only when slower than it). Rounds are
  // judged after `min_rounds`; the share above which they dominate is `max_share`.
  RoundBudget(std::uint64_t target_batch, std::uint64_t batch_size, bool delayed,
              std::size_t min_rounds = 20, double max_share = 0.3);

  void computed(Duration d, std::uint64_t samples);
  void round(Duration d);
  // Once, after min_rounds rounds: the advice if rounds dominate (nullopt otherwise, and on
  // every later call).
  std::optional<RoundAdvice> advice();

 private:
  std::uint64_t target_, batch_;
  bool delayed_;
  std::size_t min_rounds_;
  double max_share_;
  bool given_ = false;
  std::size_t rounds_ = 0;
  double round_s_ = 0, compute_s_ = 0;
  std::uint64_t samples_ = 0;
};

}  // namespace starling::training
