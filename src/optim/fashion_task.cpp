// The built-in Fashion-MNIST task: models, tensors, evaluation.
#include "starling/optim/fashion_task.hpp"

#include <torch/nn.h>
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include <fmt/format.h>

namespace starling::optim {

result<FashionModel> parse_fashion_model(const std::string& s) {
  if (s == "mlp") return FashionModel::mlp;
  if (s == "cnn") return FashionModel::cnn;
  return make_error(errc::invalid_argument, fmt::format("unknown model '{}' (mlp|cnn)", s));
}

const char* to_string(FashionModel m) {
  return m == FashionModel::mlp ? "mlp" : "cnn";
}

torch::nn::Sequential make_fashion_model(FashionModel kind, std::uint64_t seed) {
  namespace nn = torch::nn;
  torch::manual_seed(seed);
  // The layers draw their initial values from the seeded generator in a fixed order, last
  // layer first (the order of the original one-expression constructor under GCC, kept so that
  // models, checkpoints and examples/python/fashion_mnist.py stay identical on any compiler).
  if (kind == FashionModel::mlp) {
    nn::Linear out(256, training::kFashionMnistClasses);
    nn::Linear hidden(28 * 28, 256);
    return nn::Sequential(nn::Flatten(), hidden, nn::ReLU(), out);
  }
  nn::Linear out(32 * 7 * 7, training::kFashionMnistClasses);
  nn::Conv2d conv2(nn::Conv2dOptions(16, 32, 5).padding(2));
  nn::Conv2d conv1(nn::Conv2dOptions(1, 16, 5).padding(2));
  return nn::Sequential(conv1, nn::ReLU(), nn::MaxPool2d(2), conv2, nn::ReLU(), nn::MaxPool2d(2),
                        nn::Flatten(), out);
}

FashionData::FashionData(const training::ImageDataset& d) : size_(d.size()) {
  auto rows = static_cast<std::int64_t>(d.rows), cols = static_cast<std::int64_t>(d.cols);
  auto n = static_cast<std::int64_t>(d.size());
  images_ = torch::from_blob(const_cast<std::uint8_t*>(d.pixels.data()), {n, 1, rows, cols},
                             torch::kUInt8)
                .clone();
  labels_ = torch::from_blob(const_cast<std::uint8_t*>(d.labels.data()), {n}, torch::kUInt8)
                .to(torch::kInt64);
}

namespace {
torch::Tensor normalise(const torch::Tensor& u8) {
  return (u8.to(torch::kFloat32) * (1.0f / 255.0f) - training::kFashionMnistMean) *
         (1.0f / training::kFashionMnistStd);
}
}  // namespace

std::pair<torch::Tensor, torch::Tensor> FashionData::batch(
    const std::vector<std::uint32_t>& indices) const {
  auto idx = torch::from_blob(const_cast<std::uint32_t*>(indices.data()),
                              {static_cast<std::int64_t>(indices.size())}, torch::kInt32)
                 .to(torch::kInt64);
  return {normalise(images_.index_select(0, idx)), labels_.index_select(0, idx)};
}

std::pair<torch::Tensor, torch::Tensor> FashionData::range(std::size_t begin,
                                                           std::size_t end) const {
  auto b = static_cast<std::int64_t>(begin), e = static_cast<std::int64_t>(end);
  return {normalise(images_.slice(0, b, e)), labels_.slice(0, b, e)};
}

Evaluation evaluate(torch::nn::Sequential& model, const FashionData& data, std::size_t batch_size) {
  torch::NoGradGuard no_grad;
  bool was_training = model->is_training();
  model->eval();
  Evaluation ev;
  double loss_sum = 0;
  std::int64_t correct = 0;
  for (std::size_t b = 0; b < data.size(); b += batch_size) {
    auto [x, y] = data.range(b, std::min(data.size(), b + batch_size));
    auto logits = model->forward(x);
    loss_sum +=
        torch::nn::functional::cross_entropy(
            logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
            .item<double>();
    correct += logits.argmax(1).eq(y).sum().item<std::int64_t>();
  }
  ev.samples = data.size();
  if (ev.samples > 0) {
    ev.accuracy = static_cast<double>(correct) / static_cast<double>(ev.samples);
    ev.loss = loss_sum / static_cast<double>(ev.samples);
  }
  model->train(was_training);
  return ev;
}

FashionTask::FashionTask(const training::ImageDataset& train, FashionModel kind,
                         std::uint64_t model_seed, std::uint64_t stream_seed)
    : data_(train),
      model_(make_fashion_model(kind, model_seed)),
      stream_(train.size(), stream_seed) {}

double FashionTask::forward_backward(std::size_t batch_size) {
  indices_.clear();
  stream_.next(batch_size, indices_);
  return forward_backward(indices_);
}

double FashionTask::forward_backward(const std::vector<std::uint32_t>& indices) {
  auto loss = batch_loss(indices);
  loss.backward();
  return loss.item<double>();
}

torch::Tensor FashionTask::batch_loss(const std::vector<std::uint32_t>& indices) {
  auto [x, y] = data_.batch(indices);
  return torch::nn::functional::cross_entropy(model_->forward(x), y);
}

}  // namespace starling::optim
