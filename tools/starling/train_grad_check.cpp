// `starling train --grad-check` (train_grad_check.hpp).
#include "train_grad_check.hpp"

#include "starling/core/log.hpp"

namespace starling::cli {

result<std::unique_ptr<TrainGradCheck>> TrainGradCheck::create(const TrainOptions& o,
                                                               TrainTask& task,
                                                               const std::string& peer) {
  auto bad = [](const char* why) { return make_error(errc::invalid_argument, why); };
  if (!o.verify) return bad("--grad-check needs --verify");
  if (task.public_dataset_size() == 0) return bad("--grad-check: only with --task fashion");
  if (o.delay_step || o.diloco_steps > 0 || o.auxiliary)
    return bad(
        "--grad-check needs synchronous gradient steps (no --delay-step, --diloco-steps "
        "or --auxiliary)");
  if (o.worker_momentum > 0)
    return bad(
        "--grad-check re-computes a step's gradient; --worker-momentum sends a moving average "
        "of them (use one or the other)");
  if (!(o.grad_check_tol > 0)) return bad("--grad-check-tol must be > 0");
  return std::unique_ptr<TrainGradCheck>(new TrainGradCheck(o, task, peer));
}

TrainGradCheck::TrainGradCheck(const TrainOptions& o, TrainTask& task, const std::string& peer)
    : task_(task),
      mine_(o.run_id, peer, task.public_dataset_size()),
      checker_(
          task.module(),
          [&task](const std::vector<std::uint32_t>& idx) { return task.batch_loss(idx); }, o.run_id,
          task.public_dataset_size(),
          optim::GradCheckConfig{o.grad_check_tol, 32, std::max<std::size_t>(o.batch_size, 1)}) {}

double TrainGradCheck::forward_backward(std::uint64_t epoch, std::uint64_t position,
                                        std::size_t batch) {
  idx_.clear();
  mine_.indices(epoch, position, batch, idx_);
  return task_.forward_backward_on(idx_);
}

void TrainGradCheck::install(optim::OptimizerOptions& oo) {
  oo.check_contribution = [this](const training::ContributionSample& s, std::uint64_t epoch) {
    auto why = checker_.check(s, epoch);
    logger("train")->info("gradient check of {} at epoch {}: relative error {:.3g}{}",
                          s.peer.short_string(), epoch, checker_.last_error(),
                          why ? " FAILED" : "");
    return why;
  };
}

}  // namespace starling::cli
