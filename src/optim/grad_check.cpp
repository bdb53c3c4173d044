// The gradient check's re-computation (grad_check.hpp).
#include "starling/optim/grad_check.hpp"

#include <torch/autograd.h>

#include <fmt/format.h>

#include "starling/core/log.hpp"

#include <cmath>
#include <limits>

namespace starling::optim {

GradientChecker::GradientChecker(torch::nn::Module& model, BatchLoss loss, std::string run,
                                 std::uint64_t dataset_size, GradCheckConfig cfg)
    : model_(model), loss_(std::move(loss)), run_(std::move(run)), n_(dataset_size), cfg_(cfg) {}

torch::Tensor GradientChecker::recompute(const std::string& peer, std::uint64_t epoch,
                                         std::uint64_t samples) {
  const training::PublicSamples stream(run_, peer, n_);
  auto params = model_.parameters();
  std::int64_t numel = 0;
  for (const auto& p : params) numel += p.numel();
  auto acc = torch::zeros({numel}, torch::kFloat32);
  std::vector<std::uint32_t> idx;
  for (std::uint64_t first = 0; first < samples; first += cfg_.batch_size) {
    const auto b =
        static_cast<std::size_t>(std::min<std::uint64_t>(cfg_.batch_size, samples - first));
    idx.clear();
    stream.indices(epoch, first, b, idx);
    auto loss = loss_(idx);
    // autograd::grad leaves .grad alone (the trainer's accumulators are not touched).
    auto grads = torch::autograd::grad({loss}, params, {}, false, false, true);
    torch::NoGradGuard no_grad;
    std::int64_t off = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto n = params[i].numel();
      if (grads[i].defined())
        acc.narrow(0, off, n).add_(grads[i].detach().to(torch::kFloat32).reshape({-1}),
                                   static_cast<double>(b));
      off += n;
    }
  }
  if (samples > 0) acc.div_(static_cast<double>(samples));
  return acc;
}

double GradientChecker::relative_error(const training::ContributionSample& s,
                                       const torch::Tensor& recomputed) {
  const auto* r = recomputed.data_ptr<float>();
  const auto n = static_cast<std::uint64_t>(recomputed.numel());
  double diff = 0, ref = 0;
  for (const auto& sl : s.slices) {
    if (sl.offset > n || sl.values.size() > n - sl.offset)
      return std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < sl.values.size(); ++i) {
      const double x = r[sl.offset + i], d = static_cast<double>(sl.values[i]) - x;
      diff += d * d;
      ref += x * x;
    }
  }
  if (ref == 0) return diff == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff / ref);
}

std::optional<std::string> GradientChecker::check(const training::ContributionSample& s,
                                                  std::uint64_t epoch) {
  last_error_ = std::numeric_limits<double>::infinity();
  if (s.weight != std::floor(s.weight) || s.weight > 1e12)
    return fmt::format("declared {} samples: not a sample count", s.weight);
  last_error_ = std::numeric_limits<double>::quiet_NaN();
  if (!(s.weight > 0)) return std::nullopt;  // contributes nothing
  if (s.median_weight > 0 && s.weight > cfg_.max_weight_ratio * s.median_weight) {
    logger("optim")->warn(
        "gradient check of {} skipped: declared {:.0f} samples, over {}x the "
        "group's median {:.0f}",
        s.peer.short_string(), s.weight, cfg_.max_weight_ratio, s.median_weight);
    return std::nullopt;
  }
  auto re = recompute(s.peer.to_string(), epoch, static_cast<std::uint64_t>(s.weight));
  last_error_ = relative_error(s, re);
  if (last_error_ <= cfg_.rel_tol) return std::nullopt;
  return fmt::format(
      "its values differ from the re-computed gradient of its {:.0f} samples by "
      "{:.3g} (relative; tolerance {})",
      s.weight, last_error_, cfg_.rel_tol);
}

}  // namespace starling::optim
