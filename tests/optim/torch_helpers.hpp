// Helpers of the torch tests (torch_test.cpp, training_state_test.cpp).
#pragma once

#include <torch/nn.h>
#include <torch/optim/optimizer.h>

namespace starling::torch_helpers {

inline bool same_parameters(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  if (pa.size() != pb.size()) return false;
  for (std::size_t i = 0; i < pa.size(); ++i)
    if (!torch::equal(pa[i], pb[i])) return false;
  return true;
}

// One optimizer step of a Fashion-MNIST model on a fixed batch.
inline void train_step(torch::nn::Sequential& model, torch::optim::Optimizer& opt, int seed) {
  torch::manual_seed(seed);
  auto x = torch::randn({8, 1, 28, 28});
  auto y = torch::randint(0, 10, {8});
  opt.zero_grad();
  torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  opt.step();
}

}  // namespace starling::torch_helpers
