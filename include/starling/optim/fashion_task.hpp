// The built-in training task: Fashion-MNIST classification with a small MLP or CNN, batches
// drawn from a per-peer shuffled stream, and test-set evaluation. Includes torch headers:
// include it only from translation units that already pay for torch.
//
// Threading rule: a FashionTask is used from one thread (the training loop). torch may use
// its own intra-op threads (torch::set_num_threads) inside forward/backward.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include "starling/training/fashion_mnist.hpp"

namespace starling::optim {

enum class FashionModel {
  mlp,  // 784-256-10, ReLU: 203,530 parameters, the cheapest per sample
  cnn,  // conv5x5(16)-pool-conv5x5(32)-pool-fc(10): 28,938 parameters, more compute per sample
};

// "mlp" / "cnn"; errc::invalid_argument otherwise.
result<FashionModel> parse_fashion_model(const std::string& s);
const char* to_string(FashionModel m);

// Builds the model with deterministic initial parameters (torch::manual_seed(seed) first), so
// peers that start from the same seed hold identical parameters without communicating.
torch::nn::Sequential make_fashion_model(FashionModel kind, std::uint64_t seed = 0);

struct Evaluation {
  double accuracy = 0;  // fraction in [0, 1]
  double loss = 0;      // mean cross-entropy
  std::size_t samples = 0;
};

// A dataset held as tensors: images [N, 1, rows, cols] uint8, labels [N] int64.
class FashionData {
 public:
  explicit FashionData(const training::ImageDataset& d);
  std::size_t size() const noexcept { return size_; }
  // The normalised float batch [B, 1, rows, cols] and int64 labels [B] for `indices`.
  std::pair<torch::Tensor, torch::Tensor> batch(const std::vector<std::uint32_t>& indices) const;
  // Everything, in order, for evaluation (normalised).
  std::pair<torch::Tensor, torch::Tensor> range(std::size_t begin, std::size_t end) const;

 private:
  torch::Tensor images_;  // uint8
  torch::Tensor labels_;  // int64
  std::size_t size_ = 0;
};

// Accuracy and loss of `model` on `data` (no grad; the model is put in eval mode and back).
Evaluation evaluate(torch::nn::Sequential& model, const FashionData& data,
                    std::size_t batch_size = 2000);

// One peer's view of the task: the training data, its own shuffled stream and the model.
// forward_backward() computes the loss of the next batch and adds its gradient to the
// parameters' .grad (it does not zero them), which is what accumulation needs.
class FashionTask {
 public:
  FashionTask(const training::ImageDataset& train, FashionModel kind, std::uint64_t model_seed,
              std::uint64_t stream_seed);
  torch::nn::Sequential& model() noexcept { return model_; }
  training::SampleStream& stream() noexcept { return stream_; }
  // Loss of the batch (mean over it); gradients of the mean loss are added to .grad.
  double forward_backward(std::size_t batch_size);
  // The same on the given dataset indices (the gradient check's public batches).
  double forward_backward(const std::vector<std::uint32_t>& indices);
  // The mean loss of those samples, with its graph (nothing is added to .grad).
  torch::Tensor batch_loss(const std::vector<std::uint32_t>& indices);
  std::size_t dataset_size() const noexcept { return data_.size(); }

 private:
  FashionData data_;
  torch::nn::Sequential model_;
  training::SampleStream stream_;
  std::vector<std::uint32_t> indices_;
};

}  // namespace starling::optim
