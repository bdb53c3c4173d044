// The built-in language-model task: the transformer, token windows, evaluation.
#include "starling/optim/lm_task.hpp"

#include <cmath>

#include <torch/nn.h>
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include <fmt/format.h>

namespace starling::optim {

namespace F = torch::nn::functional;

result<LmConfig> parse_lm_model(const std::string& name, std::int64_t vocab) {
  LmConfig c;
  c.vocab = vocab;
  if (name == "tiny") return c;
  if (name == "small") {
    c.layers = 4;
    c.width = 256;
    return c;
  }
  return make_error(errc::invalid_argument,
                    fmt::format("unknown language model '{}' (tiny|small)", name));
}

TransformerBlockImpl::TransformerBlockImpl(std::int64_t width, std::int64_t heads,
                                           std::int64_t layers)
    : heads_(heads) {
  namespace nn = torch::nn;
  ln1_ = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({width})));
  qkv_ = register_module("qkv", nn::Linear(width, 3 * width));
  proj_ = register_module("proj", nn::Linear(width, width));
  ln2_ = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({width})));
  fc1_ = register_module("fc1", nn::Linear(width, 4 * width));
  fc2_ = register_module("fc2", nn::Linear(4 * width, width));
  torch::NoGradGuard no_grad;
  const double out_std = 0.02 / std::sqrt(2.0 * static_cast<double>(layers));
  for (auto* l : {&qkv_, &fc1_}) (*l)->weight.normal_(0, 0.02);
  for (auto* l : {&proj_, &fc2_}) (*l)->weight.normal_(0, out_std);
  for (auto* l : {&qkv_, &proj_, &fc1_, &fc2_}) (*l)->bias.zero_();
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& mask) {
  const auto b = x.size(0), t = x.size(1), w = x.size(2), hd = w / heads_;
  auto qkv = qkv_->forward(ln1_->forward(x)).view({b, t, 3, heads_, hd}).permute({2, 0, 3, 1, 4});
  auto q = qkv[0], k = qkv[1], v = qkv[2];  // [B, H, T, hd]
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  att = torch::softmax(att + mask.slice(0, 0, t).slice(1, 0, t), -1);
  auto y = torch::matmul(att, v).transpose(1, 2).reshape({b, t, w});
  auto h = x + proj_->forward(y);
  return h + fc2_->forward(torch::gelu(fc1_->forward(ln2_->forward(h))));
}

TransformerLmImpl::TransformerLmImpl(const LmConfig& c) : config_(c) {
  namespace nn = torch::nn;
  tok_ = register_module("tok", nn::Embedding(c.vocab, c.width));
  pos_ = register_parameter("pos", torch::zeros({c.seq_len, c.width}));
  blocks_ = register_module("blocks", nn::ModuleList());
  for (std::int64_t i = 0; i < c.layers; ++i)
    blocks_->push_back(TransformerBlock(c.width, c.heads, c.layers));
  ln_f_ = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({c.width})));
  // Not a buffer: derived from the config, so it stays out of the training state.
  mask_ = torch::full({c.seq_len, c.seq_len}, -std::numeric_limits<float>::infinity()).triu(1);
  torch::NoGradGuard no_grad;
  tok_->weight.normal_(0, 0.02);
  pos_.normal_(0, 0.01);
}

torch::Tensor TransformerLmImpl::forward(const torch::Tensor& tokens) {
  const auto t = tokens.size(1);
  TORCH_CHECK(t <= config_.seq_len, "sequence longer than the model's");
  auto x = tok_->forward(tokens) + pos_.slice(0, 0, t);
  for (const auto& m : *blocks_) x = m->as<TransformerBlock>()->forward(x, mask_);
  return torch::matmul(ln_f_->forward(x), tok_->weight.t());
}

TransformerLm make_lm_model(const LmConfig& c, std::uint64_t seed) {
  torch::manual_seed(seed);
  return TransformerLm(c);
}

LmData::LmData(const std::vector<training::TokenId>& tokens, std::int64_t seq_len)
    : seq_len_(seq_len) {
  std::vector<std::int64_t> wide(tokens.begin(), tokens.end());
  tokens_ = torch::from_blob(wide.data(), {static_cast<std::int64_t>(wide.size())}, torch::kInt64)
                .clone();
  windows_ = tokens.size() > 1 ? (tokens.size() - 1) / static_cast<std::size_t>(seq_len) : 0;
}

std::pair<torch::Tensor, torch::Tensor> LmData::batch(
    const std::vector<std::uint32_t>& indices) const {
  auto starts = torch::from_blob(const_cast<std::uint32_t*>(indices.data()),
                                 {static_cast<std::int64_t>(indices.size()), 1}, torch::kInt32)
                    .to(torch::kInt64) *
                seq_len_;
  auto idx = starts + torch::arange(seq_len_ + 1, torch::kInt64).unsqueeze(0);
  auto w = tokens_.index_select(0, idx.flatten()).view({-1, seq_len_ + 1});
  return {w.slice(1, 0, seq_len_), w.slice(1, 1, seq_len_ + 1)};
}

LmEvaluation evaluate_lm(TransformerLm& model, const LmData& data, std::size_t max_windows,
                         std::size_t batch_size) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  const std::size_t n = max_windows > 0 ? std::min(max_windows, data.size()) : data.size();
  double loss_sum = 0;
  std::int64_t correct = 0, tokens = 0;
  std::vector<std::uint32_t> idx;
  for (std::size_t b = 0; b < n; b += batch_size) {
    idx.clear();
    for (std::size_t i = b; i < std::min(n, b + batch_size); ++i)
      idx.push_back(static_cast<std::uint32_t>(i));
    auto [x, y] = data.batch(idx);
    auto logits = model->forward(x);
    const auto v = logits.size(-1);
    loss_sum += F::cross_entropy(logits.view({-1, v}), y.flatten(),
                                 F::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    correct += logits.argmax(-1).eq(y).sum().item<std::int64_t>();
    tokens += y.numel();
  }
  LmEvaluation ev;
  ev.tokens = static_cast<std::size_t>(tokens);
  if (tokens > 0) {
    ev.loss = loss_sum / static_cast<double>(tokens);
    ev.perplexity = std::exp(ev.loss);
    ev.accuracy = static_cast<double>(correct) / static_cast<double>(tokens);
  }
  model->train(was_training);
  return ev;
}

LmTask::LmTask(const std::vector<training::TokenId>& train, const LmConfig& config,
               std::uint64_t model_seed, std::uint64_t stream_seed)
    : data_(train, config.seq_len),
      model_(make_lm_model(config, model_seed)),
      stream_(data_.size(), stream_seed) {}

double LmTask::forward_backward(std::size_t batch_size) {
  indices_.clear();
  stream_.next(batch_size, indices_);
  auto [x, y] = data_.batch(indices_);
  auto logits = model_->forward(x);
  auto loss = F::cross_entropy(logits.view({-1, logits.size(-1)}), y.flatten());
  loss.backward();
  return loss.item<double>();
}

}  // namespace starling::optim
