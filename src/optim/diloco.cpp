// DiLoCo outer step on tensors.
#include "starling/optim/diloco.hpp"

#include <stdexcept>

#include <torch/utils.h>

namespace starling::optim {

void diloco_pseudo_gradient(std::span<const torch::Tensor> params,
                            std::span<const torch::Tensor> anchors,
                            std::span<torch::Tensor> pseudo_grads) {
  if (params.size() != anchors.size() || params.size() != pseudo_grads.size())
    throw std::invalid_argument("diloco_pseudo_gradient: span sizes differ");
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto p = params[i].detach();
    if (!pseudo_grads[i].defined()) pseudo_grads[i] = torch::empty_like(p);
    torch::sub_out(pseudo_grads[i], anchors[i], p);
  }
}

void diloco_outer_step(std::span<torch::Tensor> params, std::span<torch::Tensor> anchors,
                       std::span<const torch::Tensor> g, std::span<torch::Tensor> momentum,
                       const OuterOptions& options) {
  if (params.size() != anchors.size() || params.size() != g.size() ||
      params.size() != momentum.size())
    throw std::invalid_argument("diloco_outer_step: span sizes differ");
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!momentum[i].defined()) momentum[i] = torch::zeros_like(anchors[i]);
    auto& buf = momentum[i];
    buf.mul_(options.momentum).add_(g[i]);
    torch::Tensor update = options.nesterov ? g[i].add(buf, options.momentum) : buf;
    anchors[i].sub_(update, options.lr);
    params[i].detach().copy_(anchors[i]);
  }
}

void DilocoState::reset(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  anchors_.clear();
  for (const auto& p : params) anchors_.push_back(p.detach().clone());
  if (momentum_.size() != params.size()) momentum_.assign(params.size(), torch::Tensor());
}

std::vector<torch::Tensor> DilocoState::pseudo_gradient(
    const std::vector<torch::Tensor>& params) const {
  std::vector<torch::Tensor> out(params.size());
  diloco_pseudo_gradient(params, anchors_, out);
  return out;
}

void DilocoState::outer_step(std::vector<torch::Tensor>& params,
                             const std::vector<torch::Tensor>& avg, const OuterOptions& options) {
  if (anchors_.size() != params.size()) reset(params);
  if (momentum_.size() != params.size()) momentum_.assign(params.size(), torch::Tensor());
  diloco_outer_step(params, anchors_, avg, momentum_, options);
  ++steps_;
}

}  // namespace starling::optim
