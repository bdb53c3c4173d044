// Built-in expert types (feed-forward block, transformer block) and optimizer factories
// (expert_server.hpp).
#include <ATen/CPUGeneratorImpl.h>

#include "starling/moe/expert_server.hpp"

namespace starling::moe {

namespace {

void init_uniform(torch::Tensor& t, double bound, at::Generator& gen) {
  torch::NoGradGuard ng;
  t.uniform_(-bound, bound, gen);
}

}  // namespace

ExpertModule make_ffn_expert(std::int64_t dim, std::int64_t hidden, std::uint64_t seed) {
  torch::nn::Sequential seq(torch::nn::Linear(dim, hidden), torch::nn::GELU(),
                            torch::nn::Linear(hidden, dim));
  auto gen = at::detail::createCPUGenerator(seed);
  for (auto& p : seq->named_parameters()) {
    const bool first = p.key().rfind("0.", 0) == 0;
    const double fan_in = static_cast<double>(first ? dim : hidden);
    init_uniform(p.value(), 1.0 / std::sqrt(fan_in), gen);
  }
  ExpertModule m;
  m.parameters = seq.ptr();
  m.forward = [seq](const torch::Tensor& x) mutable { return seq->forward(x); };
  m.input_shape = {dim};
  m.output_shape = {dim};
  m.type = "ffn";
  return m;
}

ExpertModule make_transformer_expert(std::int64_t dim, std::int64_t hidden, std::int64_t seq_len,
                                     std::int64_t heads, std::uint64_t seed) {
  if (heads <= 0) {
    heads = 1;
    for (std::int64_t h : {8, 4, 2})
      if (dim % h == 0 && dim / h >= 8) {
        heads = h;
        break;
      }
  }
  // No dropout: the server's backward recomputes the forward and must get the same output.
  torch::nn::TransformerEncoderLayer layer(torch::nn::TransformerEncoderLayerOptions(dim, heads)
                                               .dim_feedforward(hidden)
                                               .dropout(0.0)
                                               .activation(torch::kGELU));
  auto gen = at::detail::createCPUGenerator(seed);
  for (auto& p : layer->named_parameters()) {
    torch::NoGradGuard ng;
    if (p.value().dim() >= 2)  // weights: uniform in +-1/sqrt(fan_in)
      init_uniform(p.value(), 1.0 / std::sqrt(static_cast<double>(p.value().size(1))), gen);
    else if (p.key().find("norm") != std::string::npos && p.key().ends_with("weight"))
      p.value().fill_(1.0);
    else
      p.value().zero_();
  }
  ExpertModule m;
  m.parameters = layer.ptr();
  // [N, T, d] -> [N, T, d]; the layer takes [T, N, d].
  m.forward = [layer](const torch::Tensor& x) mutable {
    return layer->forward(x.transpose(0, 1)).transpose(0, 1).contiguous();
  };
  m.input_shape = {seq_len, dim};
  m.output_shape = {seq_len, dim};
  m.type = "transformer";
  return m;
}

result<ExpertModule> make_builtin_expert(const std::string& type, std::int64_t dim,
                                         std::int64_t hidden, std::uint64_t seed,
                                         std::int64_t seq_len, std::int64_t heads) {
  if (dim <= 0 || hidden <= 0 || dim > 65536 || hidden > 65536)
    return Error(errc::invalid_argument, "expert dim and hidden must be in [1, 65536]");
  if (type == "ffn") return make_ffn_expert(dim, hidden, seed);
  if (type == "transformer") {
    if (seq_len <= 0 || seq_len > 65536)
      return Error(errc::invalid_argument, "transformer expert seq_len must be in [1, 65536]");
    if (heads < 0 || (heads > 0 && dim % heads != 0))
      return Error(errc::invalid_argument,
                   "transformer expert heads must divide dim " + std::to_string(dim));
    return make_transformer_expert(dim, hidden, seq_len, heads, seed);
  }
  return Error(errc::invalid_argument,
               "unknown expert type '" + type + "' (known: ffn, transformer)");
}

OptimizerFactory adam_factory(double lr) {
  return [lr](std::vector<torch::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(lr));
  };
}

OptimizerFactory sgd_factory(double lr) {
  return [lr](std::vector<torch::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(lr));
  };
}

}  // namespace starling::moe
