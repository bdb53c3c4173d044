// `starling train --task fashion-moe`: Fashion-MNIST through a decentralized mixture of
// experts (docs/moe.md). The model is a local trunk (input projection 784 -> W, the gating
// projection of a RemoteMixtureOfExperts, classifier W -> 10) around remote FFN experts served
// by `starling experts serve` processes found in the DHT. Only the trunk is module(): the
// collaborative optimizer averages it across trainers; the experts train on their servers.
#include <fmt/format.h>

#include "cli.hpp"
#include "starling/averaging/dht_directory.hpp"
#include "starling/core/log.hpp"
#include "starling/dht/node.hpp"
#include "starling/moe/remote.hpp"
#include "starling/optim/fashion_task.hpp"
#include "train_task.hpp"

namespace starling::cli {
namespace {

struct FashionMoeNetImpl : torch::nn::Module {
  FashionMoeNetImpl(std::int64_t width, moe::MoeOptions mo, std::shared_ptr<net::Host> host,
                    std::shared_ptr<moe::ExpertDirectory> dir)
      : in(register_module("in", torch::nn::Linear(784, width))),
        experts(register_module("moe", moe::RemoteMixtureOfExperts(mo, host, dir))),
        out(register_module("out", torch::nn::Linear(width, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(in->forward(x.reshape({x.size(0), 784})));
    return out->forward(torch::relu(h + experts->forward(h)));
  }
  torch::nn::Linear in;
  moe::RemoteMixtureOfExperts experts;
  torch::nn::Linear out;
};
TORCH_MODULE(FashionMoeNet);

class FashionMoeTrainTask final : public TrainTask {
 public:
  FashionMoeTrainTask(const TrainOptions& o, moe::MoeOptions mo, training::ImageDataset train,
                      training::ImageDataset test)
      : TrainTask(o), mo_(std::move(mo)), train_(train), test_(test) {}

  result<void> connect(TrainNetwork& net) override {
    host_ = net.host();
    auto node = net.dht();
    if (!host_ || !node)
      return Error(errc::invalid_argument,
                   "--task fashion-moe needs --initial-peers: its experts are found in the DHT");
    directory_ =
        std::make_shared<moe::ExpertDirectory>(std::make_shared<averaging::DhtDirectory>(node), 2s);
    return success();
  }
  void start(std::uint64_t data_seed) override {
    torch::manual_seed(o_.model_seed);
    model_ = FashionMoeNet(mo_.in_features, mo_, host_, directory_);
    stream_ = std::make_unique<training::SampleStream>(train_.size(), data_seed);
  }
  torch::nn::Module& module() override { return *model_; }
  training::SampleStream& stream() override { return *stream_; }
  double forward_backward(std::size_t batch_size) override {
    // A batch no expert answered (every server dead or failing) is retried with the next one a
    // few times, then the error reaches the training loop.
    for (int attempt = 1;; ++attempt) {
      indices_.clear();
      stream_->next(batch_size, indices_);
      auto [x, y] = train_.batch(indices_);
      try {
        auto loss = torch::nn::functional::cross_entropy(model_->forward(x), y);
        loss.backward();
        return loss.item<double>();
      } catch (const std::exception& e) {
        ++failed_batches_;
        if (attempt >= 3) throw;
        logger("train")->warn("batch failed ({}), trying the next one", e.what());
      }
    }
  }
  TaskEvaluation evaluate() override {
    torch::NoGradGuard ng;
    const std::size_t n = std::min<std::size_t>(test_.size(), o_.moe_eval_samples);
    double correct = 0, loss = 0;
    std::size_t seen = 0;
    for (std::size_t b = 0; b < n; b += 500) {
      auto [x, y] = test_.range(b, std::min(n, b + 500));
      try {
        auto logits = model_->forward(x);
        loss += torch::nn::functional::cross_entropy(logits, y).item<double>() *
                static_cast<double>(y.size(0));
        correct += logits.argmax(1).eq(y).sum().item<double>();
        seen += static_cast<std::size_t>(y.size(0));
      } catch (const std::exception& e) {
        logger("train")->warn("evaluation batch skipped: {}", e.what());
      }
    }
    if (seen == 0) return {0, 0, std::nullopt};
    const auto s = static_cast<double>(seen);
    return {correct / s, loss / s, std::nullopt};
  }
  std::string identity() const override {
    return fmt::format("fashion-moe {} w{} k{} s{} {}", mo_.grid, mo_.in_features, mo_.k,
                       o_.model_seed, optimizer_identity());
  }
  std::string describe() const override {
    std::string grid;
    for (auto g : mo_.grid_size) grid += (grid.empty() ? "" : "x") + std::to_string(g);
    return fmt::format("DMoE: 784 -> {} -> {} experts '{}' grid {} (k {}, k_min {}) -> 10",
                       mo_.in_features, mo_.grid, mo_.grid, grid, mo_.k, mo_.k_min);
  }
  std::string summary() const override {
    if (!model_) return {};
    const auto st = model_->experts->stats();
    std::string util;
    std::uint64_t total = 0;
    for (const auto& [uid, rows] : st.rows_per_expert) total += rows;
    for (const auto& [uid, rows] : st.rows_per_expert)
      util +=
          fmt::format("{}{}:{:.1f}%", util.empty() ? "" : " ", uid,
                      total ? 100.0 * static_cast<double>(rows) / static_cast<double>(total) : 0.0);
    return fmt::format(
        "moe: forward calls {} failed {} late {} sent again to another replica {}; backward "
        "calls {} failed {}; rows with no expert {}; batches failed {}; experts used {}\nmoe "
        "utilisation: {}",
        st.forward_calls, st.forward_failures, st.forward_late, st.forward_retries,
        st.backward_calls, st.backward_failures, st.empty_rows, failed_batches_,
        st.rows_per_expert.size(), util);
  }

 private:
  moe::MoeOptions mo_;
  optim::FashionData train_;
  optim::FashionData test_;
  std::shared_ptr<net::Host> host_;
  std::shared_ptr<moe::ExpertDirectory> directory_;
  FashionMoeNet model_{nullptr};
  std::unique_ptr<training::SampleStream> stream_;
  std::vector<std::uint32_t> indices_;
  std::uint64_t failed_batches_ = 0;
};

}  // namespace

result<std::unique_ptr<TrainTask>> make_fashion_moe_task(const TrainOptions& o,
                                                         training::ImageDataset train,
                                                         training::ImageDataset test) {
  moe::MoeOptions mo;
  auto dot = o.moe_grid.find('.');
  if (dot == std::string::npos || dot == 0)
    return Error(errc::invalid_argument,
                 "--moe-grid '" + o.moe_grid + "': expected PREFIX.N[.M...], e.g. ffn.4.4");
  mo.grid = o.moe_grid.substr(0, dot);
  mo.grid_size.clear();
  for (std::size_t at = dot + 1; at <= o.moe_grid.size();) {
    auto next = o.moe_grid.find('.', at);
    if (next == std::string::npos) next = o.moe_grid.size();
    std::int64_t v = 0;
    try {
      v = std::stoll(o.moe_grid.substr(at, next - at));
    } catch (const std::exception&) {
      v = 0;
    }
    if (v <= 0 || v > 4096)
      return Error(errc::invalid_argument, "--moe-grid '" + o.moe_grid + "': bad grid size");
    mo.grid_size.push_back(v);
    at = next + 1;
  }
  if (o.moe_dim <= 0 || o.moe_k == 0)
    return Error(errc::invalid_argument, "--moe-dim and --moe-k must be positive");
  mo.in_features = mo.out_features = o.moe_dim;
  mo.k = o.moe_k;
  mo.k_min = 1;
  mo.forward_timeout = seconds(o.moe_timeout);
  mo.backward_timeout = seconds(o.moe_timeout);
  mo.timeout_after_k_min = seconds(o.moe_timeout / 4);
  return std::unique_ptr<TrainTask>(
      std::make_unique<FashionMoeTrainTask>(o, mo, std::move(train), std::move(test)));
}

}  // namespace starling::cli
