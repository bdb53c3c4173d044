// The built-in tasks of `starling train` (train_task.hpp).
#include "train_task.hpp"

#include <torch/optim/adam.h>

#include <fmt/format.h>

#include "starling/optim/fashion_task.hpp"
#include "starling/optim/lamb.hpp"
#include "starling/optim/lm_task.hpp"
#include "starling/training/text_corpus.hpp"

namespace starling::cli {
namespace {

std::int64_t count_parameters(torch::nn::Module& m) {
  std::int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

class FashionTrainTask final : public TrainTask {
 public:
  FashionTrainTask(const TrainOptions& o, optim::FashionModel kind, training::ImageDataset train,
                   training::ImageDataset test)
      : TrainTask(o), kind_(kind), train_(std::move(train)), test_(test) {
    // FOR TESTING robustness (--attack label-flip): this peer trains on wrong labels.
    if (o.attack == "label-flip")
      for (auto& l : train_.labels) l = static_cast<std::uint8_t>(9 - l);
  }
  void start(std::uint64_t data_seed) override {
    task_ = std::make_unique<optim::FashionTask>(train_, kind_, o_.model_seed, data_seed);
  }
  torch::nn::Module& module() override { return *task_->model(); }
  training::SampleStream& stream() override { return task_->stream(); }
  double forward_backward(std::size_t b) override { return task_->forward_backward(b); }
  std::uint64_t public_dataset_size() const override { return train_.size(); }
  double forward_backward_on(const std::vector<std::uint32_t>& idx) override {
    return task_->forward_backward(idx);
  }
  torch::Tensor batch_loss(const std::vector<std::uint32_t>& idx) override {
    return task_->batch_loss(idx);
  }
  TaskEvaluation evaluate() override {
    auto ev = optim::evaluate(task_->model(), test_);
    return {ev.accuracy, ev.loss, std::nullopt};
  }
  std::string identity() const override {
    return fmt::format("fashion {} s{} {}", o_.model, o_.model_seed, optimizer_identity());
  }
  std::string describe() const override { return "model " + o_.model; }

 private:
  optim::FashionModel kind_;
  training::ImageDataset train_;
  optim::FashionData test_;
  std::unique_ptr<optim::FashionTask> task_;
};

class LmTrainTask final : public TrainTask {
 public:
  LmTrainTask(const TrainOptions& o, optim::LmConfig config, training::LmCorpus corpus)
      : TrainTask(o),
        config_(config),
        corpus_(std::move(corpus)),
        heldout_(corpus_.heldout, config.seq_len) {}
  void start(std::uint64_t data_seed) override {
    task_ = std::make_unique<optim::LmTask>(corpus_.train, config_, o_.model_seed, data_seed);
  }
  torch::nn::Module& module() override { return *task_->model(); }
  training::SampleStream& stream() override { return task_->stream(); }
  double forward_backward(std::size_t b) override { return task_->forward_backward(b); }
  TaskEvaluation evaluate() override {
    auto ev = optim::evaluate_lm(task_->model(), heldout_, o_.eval_windows);
    return {ev.accuracy, ev.loss, ev.perplexity};
  }
  std::string identity() const override {
    return fmt::format("lm {} s{} wn:{} bpe:{} {}", o_.model, o_.model_seed,
                       corpus_.corpus_digest.substr(0, 8), corpus_.tokenizer.hash().substr(0, 16),
                       optimizer_identity());
  }
  std::string describe() const override {
    return fmt::format(
        "lm {} ({} layers, width {}, {} parameters) vocabulary {} (bpe {}) {:.1f} MB of text, "
        "{} training / {} held-out windows of {} tokens",
        o_.model, config_.layers, config_.width, task_ ? count_parameters(*task_->model()) : 0,
        corpus_.tokenizer.vocab_size(), corpus_.tokenizer.hash().substr(0, 12),
        static_cast<double>(corpus_.text_bytes) / 1e6,
        corpus_.train.size() / static_cast<std::size_t>(config_.seq_len), heldout_.size(),
        config_.seq_len);
  }

 private:
  optim::LmConfig config_;
  training::LmCorpus corpus_;
  optim::LmData heldout_;
  std::unique_ptr<optim::LmTask> task_;
};

}  // namespace

std::string TaskEvaluation::describe() const {
  if (perplexity)
    return fmt::format("held-out perplexity {:.2f} loss {:.4f} next-token accuracy {:.4f}",
                       *perplexity, loss, accuracy);
  return fmt::format("test accuracy {:.4f} loss {:.4f}", accuracy, loss);
}

std::string TrainTask::optimizer_identity() const {
  const std::string wm =
      o_.worker_momentum > 0 ? fmt::format(" wm{}", o_.worker_momentum) : std::string();
  // DiLoCo peers apply the outer step each on its own: they must agree on it.
  const std::string outer = o_.diloco_steps > 0
                                ? fmt::format(" outer{}/{}", o_.outer_lr, o_.outer_momentum)
                                : std::string();
  if (o_.optimizer != "lamb") return "adam" + wm + outer;
  return fmt::format("lamb wd{} clip{} wu{} dc{}{}", o_.weight_decay, o_.max_grad_norm,
                     o_.warmup_epochs, o_.decay_epochs, wm + outer);
}

result<std::unique_ptr<torch::optim::Optimizer>> TrainTask::make_optimizer() {
  auto params = module().parameters();
  // Worker momentum (--worker-momentum) moves the first moment before the average.
  const double beta1 = o_.worker_momentum > 0 ? 0.0 : 0.9;
  if (o_.optimizer == "adam") {
    if (o_.warmup_epochs > 0 || o_.decay_epochs > 0)
      return make_error(errc::invalid_argument,
                        "--warmup-epochs / --decay-epochs need --optimizer lamb");
    return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(o_.lr).betas({beta1, 0.999})));
  }
  if (!(o_.lr > 0) || o_.weight_decay < 0 || o_.max_grad_norm < 0)
    return make_error(errc::invalid_argument,
                      "lamb: --lr must be > 0, --weight-decay and --max-grad-norm >= 0");
  optim::LambConfig c;
  c.lr = o_.lr;
  c.weight_decay = o_.weight_decay;
  c.max_grad_norm = o_.max_grad_norm;
  c.beta1 = beta1;
  if (o_.warmup_epochs > 0 || o_.decay_epochs > 0)
    c.schedule = training::LrSchedule{o_.lr, o_.warmup_epochs, o_.decay_epochs, 0.1};
  auto lamb = std::make_unique<optim::Lamb>(params, c);
  auto* raw = lamb.get();
  on_epoch_ = [raw](std::uint64_t e) { raw->set_epoch(e); };
  return std::unique_ptr<torch::optim::Optimizer>(std::move(lamb));
}

double TrainTask::forward_backward_on(const std::vector<std::uint32_t>&) {
  throw std::logic_error("this task has no public batches");
}
torch::Tensor TrainTask::batch_loss(const std::vector<std::uint32_t>&) {
  throw std::logic_error("this task has no public batches");
}

void TrainTask::set_epoch(std::uint64_t epoch) {
  if (on_epoch_) on_epoch_(epoch);
}

result<std::unique_ptr<TrainTask>> load_train_task(const TrainOptions& o) {
  if (o.task == "lm") {
    training::LmCorpusOptions co;
    if (!o.data_dir.empty()) co.data_dir = o.data_dir;
    co.cache_dir = o.cache_dir;
    co.vocab_size = o.vocab_size;
    ST_TRY(auto config, optim::parse_lm_model(o.model, o.vocab_size));
    auto corpus = training::load_lm_corpus(co);
    if (!corpus) return corpus.error().with_context("dataset");
    return std::unique_ptr<TrainTask>(
        std::make_unique<LmTrainTask>(o, config, std::move(corpus).value()));
  }
  auto kind = optim::FashionModel::mlp;
  if (o.task == "fashion") {
    ST_TRY(kind, optim::parse_fashion_model(o.model));
  }
  const std::string dir = o.data_dir.empty() ? training::kFashionMnistDefaultDir : o.data_dir;
  auto train = training::load_fashion_mnist(dir, training::Split::train);
  if (!train) return train.error().with_context("dataset");
  auto test = training::load_fashion_mnist(dir, training::Split::test);
  if (!test) return test.error().with_context("dataset");
  if (o.task == "fashion-moe")
    return make_fashion_moe_task(o, std::move(train).value(), std::move(test).value());
  return std::unique_ptr<TrainTask>(std::make_unique<FashionTrainTask>(
      o, kind, std::move(train).value(), std::move(test).value()));
}

}  // namespace starling::cli
