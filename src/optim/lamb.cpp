// LAMB on torch tensors (update rule in lamb.hpp).
#include "starling/optim/lamb.hpp"

#include <cmath>

#include <c10/util/string_utils.h>
#include <torch/utils.h>

namespace starling::optim {

namespace {
torch::optim::AdamWOptions adamw_options(const LambConfig& c) {
  return torch::optim::AdamWOptions(c.lr)
      .betas({c.beta1, c.beta2})
      .eps(c.eps)
      .weight_decay(c.weight_decay)
      .amsgrad(false);
}
}  // namespace

Lamb::Lamb(std::vector<torch::Tensor> params, const LambConfig& config)
    : torch::optim::AdamW(std::move(params), adamw_options(config)), config_(config) {
  TORCH_CHECK(config.trust_clip > 0, "LAMB: trust_clip must be positive");
  TORCH_CHECK(config.max_grad_norm >= 0, "LAMB: max_grad_norm must be >= 0");
}

double Lamb::current_lr() const {
  if (config_.schedule) return training::lr_at(*config_.schedule, epoch_.load());
  return param_groups_.empty() ? config_.lr : param_groups_[0].options().get_lr();
}

torch::Tensor Lamb::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  // Global gradient norm (all groups), clipped if asked.
  double sq = 0;
  for (auto& group : param_groups_)
    for (auto& p : group.params())
      if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
  last_grad_norm_ = std::sqrt(sq);
  if (config_.max_grad_norm > 0 && last_grad_norm_ > config_.max_grad_norm) {
    const double scale = config_.max_grad_norm / (last_grad_norm_ + 1e-6);
    for (auto& group : param_groups_)
      for (auto& p : group.params())
        if (p.grad().defined()) p.grad().mul_(scale);
  }
  const bool scheduled = config_.schedule.has_value();
  const double scheduled_lr = scheduled ? current_lr() : 0;
  for (auto& group : param_groups_) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    if (scheduled) o.lr(scheduled_lr);  // carried by the state format as the group's rate
    const double lr = o.lr();
    const double b1 = std::get<0>(o.betas()), b2 = std::get<1>(o.betas());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto& g = p.grad();
      const auto key = c10::guts::to_string(p.unsafeGetTensorImpl());
      auto it = state_.find(key);
      if (it == state_.end()) {
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(0);
        st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = state_.emplace(key, std::move(st)).first;
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
      st.step(st.step() + 1);
      const auto t = static_cast<double>(st.step());
      auto& m = st.exp_avg();
      auto& v = st.exp_avg_sq();
      m.mul_(b1).add_(g, 1 - b1);
      v.mul_(b2).addcmul_(g, g, 1 - b2);
      const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
      auto r = (m / bc1) / ((v / bc2).sqrt_().add_(o.eps()));
      if (o.weight_decay() != 0) r.add_(p, o.weight_decay());
      const double w_norm = std::min(p.norm().item<double>(), config_.trust_clip);
      const double r_norm = r.norm().item<double>();
      const double trust = (w_norm > 0 && r_norm > 0) ? w_norm / r_norm : 1.0;
      p.add_(r, -lr * trust);
    }
  }
  return loss;
}

}  // namespace starling::optim
