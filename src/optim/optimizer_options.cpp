// Optimizer options validation and compression names (no torch).
#include <fmt/format.h>

#include "starling/optim/optimizer_options.hpp"

namespace starling::optim {

const char* to_string(Compression c) {
  switch (c) {
    case Compression::none:
      return "none";
    case Compression::float16:
      return "float16";
    case Compression::uint8:
      return "uint8";
  }
  return "?";
}

result<Compression> parse_compression(const std::string& s) {
  if (s == "none") return Compression::none;
  if (s == "float16" || s == "fp16") return Compression::float16;
  if (s == "uint8" || s == "8bit") return Compression::uint8;
  return make_error(errc::invalid_argument,
                    fmt::format("unknown compression '{}' (none|float16|uint8)", s));
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
  // Zero would republish the progress record on every tick of the progress loop.
  if (o.progress.max_publish_interval <= Duration::zero())
    return bad("progress.max_publish_interval must be positive");
  if (o.progress.max_publish_interval * 2 > o.progress.stale_after)
    return bad("progress.stale_after must be at least twice progress.max_publish_interval");
  if (o.progress_ttl < o.progress.stale_after)
    return bad("progress_ttl is shorter than stale_after");
  if (o.auxiliary && o.diloco_steps > 0) return bad("an auxiliary peer cannot use DiLoCo");
  if (o.delay_optimizer_step && o.diloco_steps > 0)
    return bad("delay_optimizer_step is for synchronous steps, not DiLoCo");
  if (!(o.outer.lr > 0) || !(o.outer.momentum >= 0) || !(o.outer.momentum < 1))
    return bad("outer lr must be > 0 and momentum in [0, 1)");
  return success();
}

}  // namespace starling::optim
