// The built-in language-model task: a small GPT-style causal transformer (pre-LayerNorm
// blocks, learned positions, output layer tied to the token embedding, no dropout) trained
// on next-token prediction over fixed windows of the tokenized WordNet glosses
// (training/text_corpus.hpp), with held-out loss, perplexity and next-token accuracy.
// Includes torch headers: include it only from translation units that already pay for torch.
//
// Threading rule: an LmTask is used from one thread (the training loop). torch may use its own
// intra-op threads (torch::set_num_threads) inside forward/backward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>

#include "starling/training/bpe.hpp"
#include "starling/training/fashion_mnist.hpp"

namespace starling::optim {

struct LmConfig {
  std::int64_t vocab = 2048;
  std::int64_t width = 128;
  std::int64_t layers = 2;
  std::int64_t heads = 4;
  std::int64_t seq_len = 128;
};

// "tiny" (2 layers, width 128, 4 heads) / "small" (4 layers, width 256, 4 heads), sequence 128;
// errc::invalid_argument otherwise.
result<LmConfig> parse_lm_model(const std::string& name, std::int64_t vocab);

class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(std::int64_t width, std::int64_t heads, std::int64_t layers);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask);

 private:
  std::int64_t heads_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(TransformerBlock);

class TransformerLmImpl : public torch::nn::Module {
 public:
  explicit TransformerLmImpl(const LmConfig& c);
  // tokens [B, T] int64 (T <= seq_len) -> logits [B, T, vocab].
  torch::Tensor forward(const torch::Tensor& tokens);
  const LmConfig& config() const noexcept { return config_; }

 private:
  LmConfig config_;
  torch::nn::Embedding tok_{nullptr};
  torch::Tensor pos_;
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::Tensor mask_;  // [seq_len, seq_len] additive causal mask
};
TORCH_MODULE(TransformerLm);

// Deterministic initial parameters (torch::manual_seed(seed) first; normal(0, 0.02), output
// projections scaled by 1/sqrt(2 layers)), so peers with the same seed start identical.
TransformerLm make_lm_model(const LmConfig& c, std::uint64_t seed = 0);

// A token stream cut into windows of seq_len + 1 tokens (consecutive windows share one token):
// window i is the input tokens [i L, i L + L) and the targets one further.
class LmData {
 public:
  LmData(const std::vector<training::TokenId>& tokens, std::int64_t seq_len);
  std::size_t size() const noexcept { return windows_; }
  // Inputs and targets [B, L] int64 for window `indices`.
  std::pair<torch::Tensor, torch::Tensor> batch(const std::vector<std::uint32_t>& indices) const;

 private:
  torch::Tensor tokens_;  // int64 [N]
  std::int64_t seq_len_;
  std::size_t windows_ = 0;
};

struct LmEvaluation {
  double loss = 0;        // mean cross-entropy per token (nats)
  double perplexity = 0;  // exp(loss)
  double accuracy = 0;    // next-token top-1
  std::size_t tokens = 0;
};

// On the first `max_windows` windows of `data` (0: all), no grad, the model put in eval mode
// and back.
LmEvaluation evaluate_lm(TransformerLm& model, const LmData& data, std::size_t max_windows = 0,
                         std::size_t batch_size = 16);

// One peer's view of the task: the training windows, its own shuffled stream and the model.
// forward_backward() adds the gradient of the next batch's mean loss to .grad.
class LmTask {
 public:
  LmTask(const std::vector<training::TokenId>& train, const LmConfig& config,
         std::uint64_t model_seed, std::uint64_t stream_seed);
  TransformerLm& model() noexcept { return model_; }
  training::SampleStream& stream() noexcept { return stream_; }
  double forward_backward(std::size_t batch_size);

 private:
  LmData data_;
  TransformerLm model_;
  training::SampleStream stream_;
  std::vector<std::uint32_t> indices_;
};

}  // namespace starling::optim
