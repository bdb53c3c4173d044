// Optimizer options validation (no torch).
#include "starling/optim/optimizer_options.hpp"

namespace starling::optim {

result<DelayCorrection> parse_delay_correction(const std::string& s) {
  if (s == "none") return DelayCorrection::none;
  if (s == "predict") return DelayCorrection::predict;
  if (s == "local") return DelayCorrection::local;
  return make_error(errc::invalid_argument,
                    "unknown delay correction '" + s + "' (none|predict|local)");
}

const char* to_string(DelayCorrection c) {
  switch (c) {
    case DelayCorrection::predict:
      return "predict";
    case DelayCorrection::local:
      return "local";
    case DelayCorrection::none:
      break;
  }
  return "none";
}

result<void> validate(const OptimizerOptions& o) {
  auto bad = [](std::string why) {
    return make_error(errc::invalid_argument, "optimizer options: " + why);
  };
  if (o.run_id.empty()) return bad("run_id is empty");
  if (o.run_id.size() > 200) return bad("run_id is longer than 200 bytes");
  if (o.diloco_steps == 0 && o.target_batch_size == 0) return bad("target_batch_size is 0");
  if (o.diloco_steps > 0 && o.batch_size == 0)
    return bad("DiLoCo needs batch_size (the round is diloco_steps x batch_size per peer)");
  if (o.averaging_timeout <= Duration::zero() || o.load_state_timeout <= Duration::zero())
    return bad("timeouts must be positive");
  if (o.matchmaking_time < Duration::zero()) return bad("matchmaking_time is negative");
  if (o.retry_backoff < Duration::zero() || o.io_grace <= Duration::zero())
    return bad("retry_backoff must be >= 0 and io_grace > 0");
  if (o.max_failed_rounds == 0) return bad("max_failed_rounds must be at least 1");
  // Zero would republish the progress record on every tick of the progress loop.
  if (o.progress.max_publish_interval <= Duration::zero())
    return bad("progress.max_publish_interval must be positive");
  if (o.progress.max_publish_interval * 2 > o.progress.stale_after)
    return bad("progress.stale_after must be at least twice progress.max_publish_interval");
  if (o.progress_ttl < o.progress.stale_after)
    return bad("progress_ttl is shorter than stale_after");
  if (o.auxiliary && o.diloco_steps > 0) return bad("an auxiliary peer cannot use DiLoCo");
  if (o.delay_optimizer_step && o.optimizer_state_in_model)
    return bad("delay_optimizer_step needs an optimizer whose state the format carries");
  if (!(o.delay_max_backlog >= 0)) return bad("delay_max_backlog must be >= 0");
  if (!(o.worker_momentum >= 0) || !(o.worker_momentum < 1))
    return bad("worker_momentum must be in [0, 1)");
  if (o.worker_momentum > 0 && o.diloco_steps > 0)
    return bad("worker_momentum is for gradient rounds, not DiLoCo");
  if (o.delay_optimizer_step && o.diloco_steps > 0)
    return bad("delay_optimizer_step is for synchronous steps, not DiLoCo");
  if (o.check_contribution && (o.delay_optimizer_step || o.diloco_steps > 0 || o.auxiliary))
    return bad(
        "the gradient check needs synchronous gradient steps (no delay, DiLoCo or "
        "auxiliary peer)");
  if (o.check_contribution && o.worker_momentum > 0)
    return bad(
        "the gradient check re-computes a step's gradient; worker_momentum sends a "
        "moving average of them (use one or the other)");
  if (!(o.outer.lr > 0) || !(o.outer.momentum >= 0) || !(o.outer.momentum < 1))
    return bad("outer lr must be > 0 and momentum in [0, 1)");
  return success();
}

}  // namespace starling::optim
