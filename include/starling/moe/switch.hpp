// RemoteSwitchMixtureOfExperts: the Switch variant of the DMoE layer (as hivemind's
// RemoteSwitchMixtureOfExperts): each sample goes to its one best alive expert (k = 1, beam
// search over the DHT as in RemoteMixtureOfExperts), the output is the residual
//   y = x + p(e) * expert_e(x),   p(e) = prod over grid dimensions d of softmax_d(scores)[e_d],
// so a failed or late expert (or no alive expert at all) leaves y = x instead of an error, and
// a load-balancing loss (Switch Transformer) pushes the gating toward even use:
//   loss = sum over d of  grid_d * sum over c of  mean_b softmax_d(scores)[b, c] * util_d[c],
// where util_d is an exponential moving average (factor `utilisation_alpha` per forward) of the
// share of answered samples routed to coordinate c of dimension d.
//
// Threading rule: as RemoteMixtureOfExperts (a training thread, never the host's io thread).
#pragma once

#include "starling/moe/remote.hpp"

namespace starling::moe {

struct SwitchOptions {
  MoeOptions moe;                  // k and k_min are forced to 1; in == out features
  double utilisation_alpha = 0.9;  // EMA factor of the utilisation per forward
};

struct SwitchOutput {
  torch::Tensor output;          // [B, features]
  torch::Tensor balancing_loss;  // scalar, differentiable w.r.t. the gating
};

class RemoteSwitchMixtureOfExpertsImpl : public torch::nn::Module {
 public:
  RemoteSwitchMixtureOfExpertsImpl(SwitchOptions options, std::shared_ptr<net::Host> host,
                                   std::shared_ptr<ExpertDirectory> directory);
  SwitchOutput forward(const torch::Tensor& x);
  // Per grid dimension: the utilisation EMA (sums to 1 over the dimension's coordinates).
  const std::vector<torch::Tensor>& utilisation() const { return util_; }
  MoeStats stats() const { return moe->stats(); }
  // Forwards in which no expert answered (the residual path only).
  std::uint64_t residual_only() const { return residual_only_; }

  RemoteMixtureOfExperts moe{nullptr};

 private:
  SwitchOptions options_;
  std::vector<torch::Tensor> util_;
  std::uint64_t residual_only_ = 0;
};
TORCH_MODULE(RemoteSwitchMixtureOfExperts);

}  // namespace starling::moe
