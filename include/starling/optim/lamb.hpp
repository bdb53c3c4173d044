// LAMB (You et al., "Large Batch Optimization for Deep Learning", 2019), the optimizer DeDLOC
// used for its large collaborative batches, as a torch::optim optimizer. Per parameter w with
// gradient g at step t (1-based):
//
//   m = b1 m + (1 - b1) g          v = b2 v + (1 - b2) g^2
//   r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * w
//   trust = min(|w|, trust_clip) / |r|     (1 if either norm is 0)
//   w = w - lr * trust * r
//
// Before the update the gradients of all parameters may be clipped to a global L2 norm of
// `max_grad_norm` (the collaboration's averaged gradient, since starling::Optimizer hands the
// averaged gradient to its inner optimizer). With a schedule the rate of a step is
// lr_at(schedule, epoch) for the epoch last given to set_epoch(), so every peer at an epoch
// steps with the same rate.
//
// Lamb derives from torch::optim::AdamW and keeps AdamW's parameter state (step, exp_avg,
// exp_avg_sq) and options (lr, betas, eps, weight_decay; amsgrad must be false): the training
// state format carries it as AdamW, so state download and checkpoints work unchanged. Clipping,
// trust clip and schedule are configuration, not state (the task identity names them).
//
// Threading rule: step() is called by one thread at a time; set_epoch() may be called from
// another (an atomic).
#pragma once

#include <atomic>
#include <optional>

#include <torch/optim/adamw.h>

#include "starling/training/lr_schedule.hpp"

namespace starling::optim {

struct LambConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
  double trust_clip = 10;    // phi(|w|) = min(|w|, trust_clip)
  double max_grad_norm = 0;  // 0: no clipping
  std::optional<training::LrSchedule> schedule;
};

class Lamb : public torch::optim::AdamW {
 public:
  Lamb(std::vector<torch::Tensor> params, const LambConfig& config);
  torch::Tensor step(LossClosure closure = nullptr) override;

  // The collaboration's epoch the next step() belongs to (for the schedule).
  void set_epoch(std::uint64_t epoch) noexcept { epoch_.store(epoch); }
  // The rate the next step() uses.
  double current_lr() const;
  // Global gradient norm before clipping, of the last step().
  double last_grad_norm() const noexcept { return last_grad_norm_; }
  const LambConfig& config() const noexcept { return config_; }

 private:
  LambConfig config_;
  std::atomic<std::uint64_t> epoch_{0};
  double last_grad_norm_ = 0;
};

}  // namespace starling::optim
