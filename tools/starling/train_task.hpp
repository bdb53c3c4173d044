// `starling train --task fashion|lm`: the built-in tasks behind one interface for the training
// loop in cmd_train.cpp (data, model, inner optimizer, evaluation, run identity). Includes
// torch: only the CLI's torch translation units include it.
//
// Threading rule: a TrainTask is used by the training thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "starling/training/fashion_mnist.hpp"
#include "train_options.hpp"

namespace starling::cli {

struct TaskEvaluation {
  double accuracy = 0;               // test accuracy (fashion) or next-token accuracy (lm)
  double loss = 0;                   // mean cross-entropy (per sample / per token)
  std::optional<double> perplexity;  // lm: exp(loss)
  // "test accuracy 0.8123 loss 0.5234" / "held-out perplexity 123.4 loss 4.815 accuracy ..."
  std::string describe() const;
};

class TrainTask {
 public:
  virtual ~TrainTask() = default;
  // Before start(): the task's use of the trainer's network (fashion-moe finds its experts in
  // the DHT). Default: none.
  virtual result<void> connect(TrainNetwork&) { return success(); }
  // Builds the model and this peer's sample stream (data order from `data_seed`).
  virtual void start(std::uint64_t data_seed) = 0;
  virtual torch::nn::Module& module() = 0;
  virtual training::SampleStream& stream() = 0;
  // Loss of the next batch; its gradient is added to .grad.
  virtual double forward_backward(std::size_t batch_size) = 0;
  // The gradient check's public batches (train_grad_check.cpp): the training set's size (0:
  // this task has none), the loss of the given indices with its gradient added to .grad, and
  // their mean loss with its graph (nothing added to .grad).
  virtual std::uint64_t public_dataset_size() const { return 0; }
  virtual double forward_backward_on(const std::vector<std::uint32_t>& indices);
  virtual torch::Tensor batch_loss(const std::vector<std::uint32_t>& indices);
  virtual TaskEvaluation evaluate() = 0;
  // Everything peers of one run must agree on besides the run id (task, data, vocabulary,
  // model, optimizer), at most 96 bytes: published in the metrics record, and a peer whose
  // identity differs from the run's refuses to join.
  virtual std::string identity() const = 0;
  // A line for the start banner (model, parameters, data).
  virtual std::string describe() const = 0;
  // Lines printed at the end of the run ("": none).
  virtual std::string summary() const { return {}; }

  // The inner optimizer for module() (--optimizer adam|lamb).
  result<std::unique_ptr<torch::optim::Optimizer>> make_optimizer();
  // Before each step() call: the collaboration's epoch, for the LR schedule.
  void set_epoch(std::uint64_t epoch);

 protected:
  explicit TrainTask(const TrainOptions& o) : o_(o) {}
  std::string optimizer_identity() const;
  const TrainOptions& o_;

 private:
  std::function<void(std::uint64_t)> on_epoch_;
};

// Loads the task's data (errors name the missing package) and, for lm, the tokenizer.
result<std::unique_ptr<TrainTask>> load_train_task(const TrainOptions& o);
// --task fashion-moe (train_task_moe.cpp).
result<std::unique_ptr<TrainTask>> make_fashion_moe_task(const TrainOptions& o,
                                                         training::ImageDataset train,
                                                         training::ImageDataset test);

}  // namespace starling::cli
