// The gradient check's re-computation (issue 20 item 2c; docs/security.md "Gradient check").
// Under the check, a trainer's samples toward epoch e are the public stream of
// training::PublicSamples (run, its peer id, e), and its contribution for e is the mean
// gradient of the loss over the first W of them (W: the samples it declared) at the epoch's
// parameters: a deterministic function of public values. A validator re-computes it on its
// own model (at the same epoch's parameters) and compares it with the values the member sent
// for the parts the validator owns. Includes torch.
//
// Threading rule: the training thread (it runs the model; the parameters must not change
// during a call).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "starling/training/collaboration.hpp"
#include "starling/training/public_samples.hpp"

namespace starling::optim {

struct GradCheckConfig {
  // A member fails when |sent - recomputed| > rel_tol x |recomputed| over the slices held
  // (float summation order and thread counts give ~1e-6 between honest peers: measured in
  // docs/security.md).
  double rel_tol = 1e-3;
  // A member that declared more than this many times the group's median samples is not
  // re-computed (bounds a validator's cost; CenteredClip caps such a weight anyway): logged,
  // never a verdict (honest counts vary: 9x the median was seen in a clean run).
  double max_weight_ratio = 32;
  std::size_t batch_size = 64;  // samples per forward/backward of the re-computation
};

// The mean loss of a batch of dataset indices (the task's; it must not touch .grad).
using BatchLoss = std::function<torch::Tensor(const std::vector<std::uint32_t>& indices)>;

class GradientChecker {
 public:
  GradientChecker(torch::nn::Module& model, BatchLoss loss, std::string run,
                  std::uint64_t dataset_size, GradCheckConfig cfg = {});
  // The contribution of `peer` for `epoch` with `samples` samples, flat in the order of
  // model.parameters() (the optimizer's layout), at the model's current parameters.
  torch::Tensor recompute(const std::string& peer, std::uint64_t epoch, std::uint64_t samples);
  // |sent - recomputed| / |recomputed| over the sample's slices (infinity for bad slices).
  static double relative_error(const training::ContributionSample& s,
                               const torch::Tensor& recomputed);
  // OptimizerOptions::check_contribution: why the member fails, or nullopt (it passed, or was
  // not re-computed: last_error() is then NaN).
  std::optional<std::string> check(const training::ContributionSample& s, std::uint64_t epoch);
  const GradCheckConfig& config() const { return cfg_; }
  double last_error() const { return last_error_; }  // of the last check() (NaN: skipped)

 private:
  torch::nn::Module& model_;
  BatchLoss loss_;
  std::string run_;
  std::uint64_t n_;
  GradCheckConfig cfg_;
  double last_error_ = 0;
};

}  // namespace starling::optim
