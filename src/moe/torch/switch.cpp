// The Switch variant of the DMoE layer (switch.hpp).
#include "starling/moe/switch.hpp"

#include "starling/core/log.hpp"

namespace starling::moe {

namespace {
MoeOptions top1(MoeOptions o) {
  o.k = 1;
  o.k_min = 1;
  return o;
}
}  // namespace

RemoteSwitchMixtureOfExpertsImpl::RemoteSwitchMixtureOfExpertsImpl(
    SwitchOptions options, std::shared_ptr<net::Host> host,
    std::shared_ptr<ExpertDirectory> directory)
    : options_(std::move(options)) {
  if (options_.moe.in_features != options_.moe.out_features)
    throw std::invalid_argument("RemoteSwitchMixtureOfExperts: the residual needs in == out");
  moe = register_module(
      "moe", RemoteMixtureOfExperts(top1(options_.moe), std::move(host), std::move(directory)));
  for (auto g : options_.moe.grid_size)
    util_.push_back(torch::full({g}, 1.0 / static_cast<double>(g), torch::kFloat32));
}

SwitchOutput RemoteSwitchMixtureOfExpertsImpl::forward(const torch::Tensor& x) {
  const auto& grid = options_.moe.grid_size;
  const std::int64_t B = x.size(0);
  // The gating's per-dimension probabilities (the inner layer computes the same scores).
  torch::Tensor logits = moe->proj->forward(x);
  std::vector<torch::Tensor> probs;
  std::int64_t off = 0;
  for (auto g : grid) {
    probs.push_back(torch::softmax(logits.narrow(1, off, g), 1));
    off += g;
  }
  torch::Tensor expert_out;
  try {
    expert_out = moe->forward(x);  // k = 1: the answered expert's output, zeros otherwise
  } catch (const std::exception& e) {
    // No expert answered: the residual path alone.
    ++residual_only_;
    logger("moe")->debug("switch: residual only: {}", e.what());
  }
  SwitchOutput out;
  torch::Tensor answered;
  if (expert_out.defined()) {
    answered = moe->last_answered.select(1, 0);  // [B]
    torch::Tensor p = torch::ones({B});
    for (std::size_t d = 0; d < grid.size(); ++d) {
      auto coord = moe->last_coords.select(1, 0).select(1, static_cast<std::int64_t>(d));
      p = p * probs[d].gather(1, coord.unsqueeze(1)).squeeze(1);
    }
    p = p * answered.to(torch::kFloat32);
    out.output = x + p.unsqueeze(1) * expert_out;
  } else {
    out.output = x;
  }
  // Utilisation EMA over the answered samples, then the balancing loss.
  {
    torch::NoGradGuard ng;
    const auto n = answered.defined() ? answered.sum().item<std::int64_t>() : 0;
    for (std::size_t d = 0; d < grid.size(); ++d) {
      if (n == 0) break;
      auto coord = moe->last_coords.select(1, 0).select(1, static_cast<std::int64_t>(d));
      auto counts =
          torch::zeros({grid[d]}).index_add_(0, coord.masked_select(answered), torch::ones({n}));
      util_[d] = options_.utilisation_alpha * util_[d] +
                 (1 - options_.utilisation_alpha) * counts / static_cast<double>(n);
    }
  }
  torch::Tensor loss = torch::zeros({});
  for (std::size_t d = 0; d < grid.size(); ++d)
    loss = loss + static_cast<double>(grid[d]) * (probs[d].mean(0) * util_[d]).sum();
  out.balancing_loss = loss;
  return out;
}

}  // namespace starling::moe
