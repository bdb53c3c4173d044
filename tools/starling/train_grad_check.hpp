// `starling train --grad-check K` (docs/security.md "Gradient check"): batches from the public
// per-(run, peer, epoch) sample stream, and the optimizer's re-computation of the members the
// round's seed drew. Includes torch: only the CLI's torch translation units include it.
//
// Threading rule: the training thread.
#pragma once

#include <memory>

#include "starling/optim/grad_check.hpp"
#include "starling/optim/optimizer.hpp"
#include "train_task.hpp"

namespace starling::cli {

class TrainGradCheck {
 public:
  // Errors: options the check cannot work with (another task, delayed or DiLoCo steps, an
  // auxiliary peer, no --verify).
  static result<std::unique_ptr<TrainGradCheck>> create(const TrainOptions& o, TrainTask& task,
                                                        const std::string& peer);
  // The loss of this peer's next public batch (samples `position` .. toward `epoch`), its
  // gradient added to .grad.
  double forward_backward(std::uint64_t epoch, std::uint64_t position, std::size_t batch);
  // Fills OptimizerOptions::check_contribution (this object must outlive the optimizer).
  void install(optim::OptimizerOptions& oo);

 private:
  TrainGradCheck(const TrainOptions& o, TrainTask& task, const std::string& peer);
  TrainTask& task_;
  training::PublicSamples mine_;
  optim::GradientChecker checker_;
  std::vector<std::uint32_t> idx_;
};

}  // namespace starling::cli
