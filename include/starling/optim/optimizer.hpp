// starling::Optimizer: collaborative training (DeDLOC, and DiLoCo local updates) around any
// torch::optim optimizer. Peers accumulate gradients at their own pace and publish their
// progress; when the collaboration has accumulated `target_batch_size` samples, all peers
// average their gradients (weighted by samples) and take one optimizer step together, so the
// collaboration's epoch advances and the hyperparameters never depend on how many peers there
// are. A peer that is behind downloads parameters and optimizer state; a peer that dies never
// stalls the others; a peer alone keeps training and steps on its own.
//
// Usage (a user's own training loop; see examples/):
//
//   starling::optim::OptimizerOptions o;
//   o.run_id = "my-run";
//   o.target_batch_size = 4096;
//   auto opt = starling::Optimizer::create(
//       *model, std::make_unique<torch::optim::Adam>(model->parameters(), 1e-3), o,
//       node->collaboration()).value();   // a collab::TrainingNode; nullptr: train alone
//   for (auto& [x, y] : loader) {
//     torch::nn::functional::cross_entropy(model->forward(x), y).backward();
//     opt->step(x.size(0));                              // instead of adam.step()
//   }
//   opt->shutdown();
//
// Threading rule: create(), step(), zero_grad(), status(), save_checkpoint() and shutdown()
// are called from one thread, the training thread. The networked work runs as coroutines on
// the collaboration's executor, which must be run by another thread (the node's io thread);
// the training thread blocks in step() only while the optimizer averages synchronously,
// downloads state, or applies a step. Includes torch headers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "starling/optim/optimizer_options.hpp"
#include "starling/training/checkpoint.hpp"

namespace starling::optim {

class Optimizer {
 public:
  // Wraps `inner`, which must optimise exactly `model`'s parameters. With a collaboration,
  // joins it (publishes progress, serves state); without one (nullptr) the peer trains alone
  // with the same semantics (it steps every target_batch_size samples). Resumes from
  // options.checkpoint_dir if it holds a checkpoint for this model.
  static result<std::unique_ptr<Optimizer>> create(
      torch::nn::Module& model, std::unique_ptr<torch::optim::Optimizer> inner,
      OptimizerOptions options, std::shared_ptr<training::Collaboration> collaboration = nullptr);
  ~Optimizer();  // shutdown() if not done yet
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Call after backward() on a batch of `batch_size` samples (0: options.batch_size). Adds the
  // gradients to this peer's accumulators and clears the parameters' .grad; when the
  // collaboration reaches the target, averages with the group and steps. Errors are only for
  // misuse (no batch size, after shutdown); network failures are reported in StepReport and
  // handled (retry, step alone, download state) without failing the call.
  result<StepReport> step(std::size_t batch_size = 0);
  // Auxiliary peers (options.auxiliary) call this in a loop instead of step(): follows the
  // collaboration's epoch and joins its rounds with weight 0 (helping the all-reduce without
  // computing). Returns at once when there is nothing to do; blocks during a round.
  result<StepReport> assist();
  // Clears the parameters' .grad (the accumulators are kept).
  void zero_grad();

  std::uint64_t local_epoch() const;
  // Samples accumulated toward local_epoch() so far (the position of the next batch in the
  // epoch's public sample stream under the gradient check: training/public_samples.hpp).
  std::uint64_t epoch_samples() const;
  // A digest of the parameters at local_epoch() (StateDigest; peers holding identical
  // parameters have the same value). Published in the progress record, so peers at the same
  // epoch with other parameters (a fork) are found and download the state most peers hold.
  std::uint64_t state_digest() const;
  // Delayed updates: waits for the round in flight (bounded by averaging_timeout) and applies
  // its step, as step() would, and leaves the model at the collaboration's parameters (not
  // a prediction or local step); no-op otherwise. Call before stopping after a last step() so the
  // peer does not leave with a round it started.
  void finish_round();
  // Runs `f` (on the training thread) with the model holding the collaboration's parameters at
  // local_epoch(): with delayed updates and a DelayCorrection, the model otherwise holds the
  // parameters that gradients are computed at (extrapolated, or one local step ahead). For
  // evaluation and export.
  void with_collaboration_parameters(const std::function<void()>& f);
  // Serves a pending state request of a peer without training (for a peer that stays a
  // moment after its last step so that peers behind can still download the final state).
  void serve_state_requests();
  OptimizerStatus status() const;
  torch::optim::Optimizer& inner();
  const OptimizerOptions& options() const;

  // Loads parameters and optimizer state from peers now (normally step() does this when it
  // finds this peer behind).
  result<void> load_state_from_peers();
  // Writes a checkpoint to options.checkpoint_dir now (errc::invalid_argument if none).
  // `stream_pass`/`stream_position` record the data position for resuming.
  result<std::filesystem::path> save_checkpoint(std::uint64_t stream_pass = 0,
                                                std::uint64_t stream_position = 0);
  // The metadata create() resumed from, if any.
  const std::optional<training::CheckpointMeta>& resumed_from() const;

  // Leaves the collaboration: finishes or cancels the round in flight, stops publishing,
  // writes a final checkpoint. Bounded by `timeout`. Idempotent.
  result<void> shutdown(Duration timeout = 10s);

 private:
  struct Impl;
  explicit Optimizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace starling::optim

namespace starling {
using Optimizer = optim::Optimizer;
using OptimizerOptions = optim::OptimizerOptions;
}  // namespace starling
