// A tiny regression task for optimizer tests: Linear(4, 1) from a seed, synthetic batches
// y = x . w* + 0.5 plus noise, and the flattened parameters (for equality checks).
#pragma once

#include <torch/nn.h>

namespace starling::test {

inline torch::nn::Linear make_linear(int seed) {
  torch::manual_seed(seed);
  return torch::nn::Linear(4, 1);
}

inline std::pair<torch::Tensor, torch::Tensor> batch(torch::Generator& gen, int n) {
  auto x = torch::randn({n, 4}, gen);
  auto w = torch::tensor({{1.0f}, {-2.0f}, {0.5f}, {3.0f}});
  auto y = x.matmul(w) + 0.5 + 0.01 * torch::randn({n, 1}, gen);
  return {x, y};
}

inline torch::Tensor flat_params(torch::nn::Module& m) {
  std::vector<torch::Tensor> v;
  for (auto& p : m.parameters()) v.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(v);
}

}  // namespace starling::test
