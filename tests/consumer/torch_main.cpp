// Uses the installed starling::torch: a libtorch model trained with starling::Optimizer alone
// (no collaboration); 8 batches of 8 samples with a target batch of 32 must make 2 epochs.
#include <iostream>

#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include "starling/optim/optimizer.hpp"

int main() {
  torch::manual_seed(1);
  torch::nn::Linear model(4, 1);
  starling::optim::OptimizerOptions o;
  o.run_id = "consumer";
  o.target_batch_size = 32;
  o.batch_size = 8;
  auto opt = starling::optim::Optimizer::create(
      *model, std::make_unique<torch::optim::Adam>(model->parameters(), 0.01), o, nullptr);
  if (!opt) {
    std::cerr << "error: " << opt.error().message() << "\n";
    return 1;
  }
  for (int i = 0; i < 8; ++i) {
    auto x = torch::randn({8, 4});
    auto loss = (model(x) - x.sum(1, true)).pow(2).mean();
    loss.backward();
    if (!opt.value()->step(8)) return 1;
  }
  std::cout << "epochs " << opt.value()->local_epoch() << "\n";
  return opt.value()->local_epoch() == 2 ? 0 : 1;
}
