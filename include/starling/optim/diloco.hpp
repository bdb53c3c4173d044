// DiLoCo outer optimisation: after H local steps of the inner optimizer, peers average their
// pseudo-gradients (start-of-round parameters minus current parameters) and every peer applies
// the same outer step, SGD with Nesterov momentum:
//   buf    <- momentum * buf + g          (buf starts at 0)
//   update <- g + momentum * buf          (nesterov; plain momentum uses buf)
//   anchor <- anchor - outer_lr * update;  params <- anchor
// This matches torch.optim.SGD(lr, momentum, nesterov=True, dampening=0) applied to the
// anchor with gradient g. Includes torch headers.
//
// Threading rule: call from the thread that owns the model (no inner step may run at the same
// time).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <torch/types.h>

#include "starling/optim/optimizer_options.hpp"

namespace starling::optim {

// pseudo_grads[i] = anchors[i] - params[i] (allocated if undefined).
void diloco_pseudo_gradient(std::span<const torch::Tensor> params,
                            std::span<const torch::Tensor> anchors,
                            std::span<torch::Tensor> pseudo_grads);

// One outer step with the averaged pseudo-gradient `g`: updates `momentum` (allocated as
// zeros if undefined) and `anchors`, and copies the new anchors into `params`.
// All spans have the same length and matching shapes.
void diloco_outer_step(std::span<torch::Tensor> params, std::span<torch::Tensor> anchors,
                       std::span<const torch::Tensor> g, std::span<torch::Tensor> momentum,
                       const OuterOptions& options);

// The outer state of one peer: anchors (parameters at the start of the round), momentum
// buffers, and the number of outer steps taken.
class DilocoState {
 public:
  DilocoState() = default;
  // Takes the anchors from the current parameters (at the start, or after loading state).
  void reset(const std::vector<torch::Tensor>& params);
  // anchors - params, one tensor per parameter.
  std::vector<torch::Tensor> pseudo_gradient(const std::vector<torch::Tensor>& params) const;
  // Applies the outer step with the averaged pseudo-gradient; params become the new anchors.
  void outer_step(std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& avg,
                  const OuterOptions& options);
  std::uint64_t outer_steps() const noexcept { return steps_; }
  void set_outer_steps(std::uint64_t n) noexcept { steps_ = n; }
  std::vector<torch::Tensor>& anchors() noexcept { return anchors_; }
  std::vector<torch::Tensor>& momentum() noexcept { return momentum_; }

 private:
  std::vector<torch::Tensor> anchors_;
  std::vector<torch::Tensor> momentum_;
  std::uint64_t steps_ = 0;
};

}  // namespace starling::optim
