// `starling train` flags, --config FILE, and their translation into optimizer options.
#include "train_options.hpp"
#include <algorithm>

#include <cmath>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.hpp"

namespace starling::cli {

void add_train_flags(CLI::App& cmd, TrainOptions& o) {
  o.identity = default_identity_path();
  cmd.add_option("--identity,-i", o.identity, "identity file (created if missing)")
      ->capture_default_str();
  cmd.add_option("--initial-peers", o.initial_peers,
                 "multiaddr of a peer or bootstrap node to join (repeatable)");
  cmd.add_option("--listen,-l", o.listen, "multiaddr to listen on (repeatable)")
      ->capture_default_str();
  cmd.add_option("--directory", o.directory,
                 "shared directory that stands in for the DHT (processes on one machine)");
  cmd.add_option(
      "--run-id", o.run_id,
      "name of the collaboration (default: fashion-mnist, or wordnet-lm with --task lm)");
  cmd.add_option("--target-batch-size", o.target_batch_size,
                 "samples the collaboration accumulates per optimizer step")
      ->capture_default_str();
  cmd.add_option("--batch-size", o.batch_size, "samples per local forward/backward")
      ->capture_default_str();
  cmd.add_option("--threads", o.threads, "torch compute threads")->capture_default_str();
  cmd.add_option("--max-bandwidth", o.max_bandwidth,
                 "upload and download limit in bytes/s (k/M/G suffixes; 0: unlimited)")
      ->capture_default_str();
  cmd.add_option("--checkpoint-dir", o.checkpoint_dir, "save and resume checkpoints here");
  cmd.add_option("--diloco-steps", o.diloco_steps,
                 "DiLoCo: local steps between outer rounds (0: synchronous DeDLOC steps)")
      ->capture_default_str();
  cmd.add_option("--outer-lr", o.outer_lr, "DiLoCo: outer learning rate")->capture_default_str();
  cmd.add_option("--outer-momentum", o.outer_momentum, "DiLoCo: outer Nesterov momentum (0: none)")
      ->capture_default_str();
  cmd.add_option("--config", o.config, "JSON file of flags ({\"target-batch-size\": 2048, ...})");
  cmd.add_option("--task", o.task,
                 "built-in task: fashion (Fashion-MNIST) or lm (transformer language model on "
                 "WordNet's glosses)")
      ->capture_default_str();
  cmd.add_option("--model", o.model,
                 "model: mlp or cnn (fashion, default mlp); tiny or small (lm, default tiny)");
  cmd.add_option("--optimizer", o.optimizer, "inner optimizer: adam or lamb")
      ->capture_default_str();
  cmd.add_option("--lr", o.lr, "learning rate (lamb: the peak of the schedule)")
      ->capture_default_str();
  cmd.add_option("--weight-decay", o.weight_decay, "lamb: weight decay")->capture_default_str();
  cmd.add_option("--max-grad-norm", o.max_grad_norm,
                 "lamb: clip the averaged gradient to this L2 norm (0: no clipping)")
      ->capture_default_str();
  cmd.add_option("--warmup-epochs", o.warmup_epochs,
                 "lamb: linear learning-rate warm-up over this many collaboration epochs");
  cmd.add_option("--decay-epochs", o.decay_epochs,
                 "lamb: cosine decay to 0.1 x lr, ending at this collaboration epoch (0: none)");
  cmd.add_option("--vocab-size", o.vocab_size, "lm: BPE vocabulary size (all peers must agree)")
      ->capture_default_str();
  cmd.add_option("--cache-dir", o.cache_dir, "lm: tokenizer cache (default ~/.cache/starling)");
  cmd.add_option("--eval-windows", o.eval_windows,
                 "lm: held-out windows of 128 tokens evaluated (0: all)")
      ->capture_default_str();
  cmd.add_option("--moe-grid", o.moe_grid, "fashion-moe: expert grid PREFIX.N[.M...]")
      ->capture_default_str();
  cmd.add_option("--moe-dim", o.moe_dim, "fashion-moe: expert width (the servers' --dim)")
      ->capture_default_str();
  cmd.add_option("--moe-k", o.moe_k, "fashion-moe: experts per sample")->capture_default_str();
  cmd.add_option("--moe-timeout", o.moe_timeout, "fashion-moe: seconds per forward/backward")
      ->capture_default_str();
  cmd.add_option("--moe-eval-samples", o.moe_eval_samples, "fashion-moe: test samples evaluated")
      ->capture_default_str();
  cmd.add_option("--data-dir", o.data_dir,
                 "data directory (fashion: Fashion-MNIST IDX files; lm: WordNet database)");
  cmd.add_option("--model-seed", o.model_seed, "initial parameters (all peers must agree)")
      ->capture_default_str();
  cmd.add_option("--data-seed", o.data_seed, "data order (0: derived from the identity)");
  cmd.add_option("--compression", o.compression, "gradient compression: none, float16, uint8")
      ->capture_default_str();
  cmd.add_option("--aggregation", o.aggregation,
                 "how this peer reduces the gradient parts it owns: mean, or centered-clip "
                 "(bounds what a hostile peer can do; every peer of a run should use the same)")
      ->capture_default_str();
  cmd.add_option("--clip-tau", o.clip_tau,
                 "centered-clip radius per part (0: adaptive, the median distance to the "
                 "coordinate-wise median)")
      ->capture_default_str();
  cmd.add_option("--clip-cut", o.clip_cut,
                 "centered-clip with an adaptive radius: members farther than this x the "
                 "radius count 0, tapered from half of it (0: none; > 2; every peer of a run "
                 "must use the same)")
      ->capture_default_str();
  cmd.add_option(
         "--attack", o.attack,
         "FOR TESTING ROBUSTNESS: send reversed (sign-flip, x -10) or random (noise 100x the "
         "gradient's RMS) gradients claiming 10x the samples, the gradient minus one standard "
         "deviation per coordinate (alie), train on flipped labels (label-flip, task fashion), "
         "join groups and send nothing (stall), publish fake progress records under fresh "
         "identities (flood), send the previous round's gradient (stale) or claim 4x the "
         "samples (inflated); with --verify: return shifted averages as an "
         "owner (wrong-average), send one owner other values than committed (different-parts) "
         "or lie in projection reports (false-report), or publish false accusations in the DHT "
         "(directory-lie)")
      ->capture_default_str();
  cmd.add_option("--run-key", o.run_key,
                 "a private run: its run key (starling run-key new); only peers with a "
                 "certificate it signed take part (needs --membership)");
  cmd.add_option("--membership", o.membership,
                 "this peer's membership certificate file (starling run-key sign)");
  cmd.add_option("--revocations", o.revocations,
                 "a revocation list (starling run-key revoke) to apply and publish to the run");
  cmd.add_flag("--verify", o.verify,
               "accountability: sign and check every averaging statement, ban peers caught "
               "cheating (gradients travel uncompressed; every peer of a run should use it)");
  cmd.add_option("--grad-check", o.grad_check,
                 "gradient check (needs --verify, --task fashion, synchronous steps): batches "
                 "are drawn from a public per-(run, peer, epoch) stream, and after each round "
                 "every member re-computes this many members drawn from the round's seed and "
                 "bans those whose values differ (0: off; costs that many peers' epochs of "
                 "compute per round)");
  cmd.add_option("--grad-check-tol", o.grad_check_tol,
                 "gradient check: the relative difference a member may show");
  cmd.add_flag("--relay", o.relay,
               "serve circuit relay v2 and AutoNAT to peers behind NATs (needs a public address)");
  cmd.add_flag("--use-relays", o.use_relays,
               "behind a NAT: hold relay reservations with the initial peers and announce the "
               "/p2p-circuit addresses, so peers reach this one through them");
  cmd.add_flag("--hole-punching", o.hole_punching,
               "DCUtR: upgrade relayed connections to direct ones by TCP hole punching");
  cmd.add_flag("--allow-private", o.allow_private,
               "treat private addresses as public for AutoNAT dial-backs and DCUtR (labs)");
  cmd.add_option("--port-mapping", o.port_mapping,
                 "ask the home router to forward the listening port: auto (PCP, NAT-PMP, then "
                 "UPnP IGD), pcp, natpmp, upnp or off; only an IPv4 port listening beyond loopback "
                 "is mapped; the mapped address is announced")
      ->capture_default_str();
  cmd.add_flag("--client", o.client,
               "client mode: accept no incoming connections (behind NAT); still averages");
  cmd.add_flag("--auxiliary", o.auxiliary,
               "auxiliary peer: computes nothing, only helps the others average (weight 0)");
  cmd.add_flag("--delay-step", o.delay_step,
               "delayed parameter updates: the round and the step run in the background");
  cmd.add_option("--delay-correction", o.delay_correction,
                 "with --delay-step: none (gradients one step stale), predict (gradients at the "
                 "parameters extrapolated by the last step) or local (gradients after a local "
                 "step with this peer's own gradient, replaced by the average one round later)")
      ->capture_default_str();
  cmd.add_option("--max-backlog", o.max_backlog,
                 "with --delay-step: wait for the round in flight once this peer computed this "
                 "many targets' share meanwhile (0: never)")
      ->capture_default_str();
  cmd.add_option("--worker-momentum", o.worker_momentum,
                 "each peer averages the moving average of its gradients with this factor "
                 "(0: off; 0.9 with --aggregation centered-clip against small hidden shifts) "
                 "and the inner optimizer gets no momentum of its own")
      ->capture_default_str();
  cmd.add_option("--max-epochs", o.max_epochs, "stop when the collaboration reaches this epoch");
  cmd.add_option("--max-samples", o.max_samples, "stop after contributing this many samples");
  cmd.add_option("--max-seconds", o.max_seconds, "stop after this many seconds");
  cmd.add_option("--linger", o.linger,
                 "after the last step, serve the state to peers still behind for up to this many "
                 "seconds")
      ->capture_default_str();
  cmd.add_option("--eval-every", o.eval_every, "evaluate on the test set every N epochs");
  cmd.add_option("--target-accuracy", o.target_accuracy,
                 "report when an evaluation first reaches this test accuracy (needs --eval-every)")
      ->check(CLI::Range(0.0, 1.0));
  cmd.add_flag("--stop-at-target", o.stop_at_target, "stop once --target-accuracy is reached");
  cmd.add_option("--eval-pause-file", o.eval_pause_file,
                 "benchmarks: stop the processes whose ids this file lists while evaluating "
                 "(SIGSTOP, then SIGCONT), so that evaluation time is time nobody computed");
  cmd.add_option("--start-barrier", o.start_barrier,
                 "benchmarks: once ready to train, create DIR/ready.<pid> and wait (at most "
                 "120 s) for DIR/go, so that trainers start their clocks together");
  cmd.add_option("--progress-every", o.progress_every,
                 "seconds between progress lines when stderr is not a terminal")
      ->capture_default_str();
  cmd.add_option("--report", o.report, "write a JSON summary to this file at the end");
  cmd.add_option("--averaging-timeout", o.averaging_timeout, "seconds")->capture_default_str();
  cmd.add_option("--matchmaking-time", o.matchmaking_time, "seconds")->capture_default_str();
  cmd.add_option("--startup-grace", o.startup_grace,
                 "seconds: the least a peer waits before its first round so that peers started "
                 "with it see each other (10 x its first progress publication, at most "
                 "--matchmaking-time; 0: always --matchmaking-time)")
      ->capture_default_str();
  cmd.add_option("--metrics", o.metrics,
                 "publish this trainer's metrics record in the DHT for monitors (default: on "
                 "when networked); --metrics HOST:PORT also serves Prometheus text at "
                 "http://HOST:PORT/metrics")
      ->expected(0, 1)
      ->default_str("on");
  cmd.add_flag("--no-metrics", o.no_metrics, "publish no metrics record");
  cmd.add_option("--metrics-interval", o.metrics_interval,
                 "seconds between metrics records (each lives 6 intervals, at least 60 s)")
      ->capture_default_str();
  cmd.add_option("--name", o.name,
                 "display name on the run's dashboard (at most 32 bytes; default: none)");
}

result<void> apply_train_config(CLI::App& cmd, const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(errc::not_found, fmt::format("--config {}: cannot open", path));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, fmt::format("--config {}: {}", path, e.what()));
  }
  if (!j.is_object())
    return make_error(errc::invalid_argument,
                      fmt::format("--config {}: expected a JSON object of flags", path));
  for (auto& [key, value] : j.items()) {
    if (key == "config")
      return make_error(errc::invalid_argument, fmt::format("--config {}: nested config", path));
    CLI::Option* opt = nullptr;
    try {
      opt = cmd.get_option("--" + key);
    } catch (const CLI::OptionNotFound&) {
      return make_error(errc::invalid_argument,
                        fmt::format("--config {}: unknown flag '{}'", path, key));
    }
    if (opt->count() > 0) continue;  // the command line wins
    std::vector<std::string> values;
    auto text = [](const nlohmann::json& v) {
      return v.is_string() ? v.get<std::string>() : v.dump();
    };
    if (value.is_array())
      for (auto& v : value) values.push_back(text(v));
    else
      values.push_back(text(value));
    try {
      for (auto& v : values) opt->add_result(v);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      return make_error(errc::invalid_argument,
                        fmt::format("--config {}: '{}': {}", path, key, e.what()));
    }
  }
  return success();
}

result<void> resolve_task_defaults(TrainOptions& o) {
  if (o.task != "fashion" && o.task != "lm" && o.task != "fashion-moe")
    return make_error(errc::invalid_argument,
                      fmt::format("unknown --task '{}' (fashion|lm|fashion-moe)", o.task));
  if (o.optimizer != "adam" && o.optimizer != "lamb")
    return make_error(errc::invalid_argument,
                      fmt::format("unknown --optimizer '{}' (adam|lamb)", o.optimizer));
  const bool lm = o.task == "lm";
  if (o.run_id.empty())
    o.run_id = lm ? "wordnet-lm" : o.task == "fashion" ? "fashion-mnist" : o.task;
  if (o.model.empty()) o.model = lm ? "tiny" : "mlp";
  return success();
}

result<std::uint64_t> parse_bandwidth(const std::string& s) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    return make_error(errc::invalid_argument, fmt::format("bandwidth '{}': not a number", s));
  }
  double mult = 1;
  const std::string suffix = s.substr(used);
  if (suffix == "k" || suffix == "K")
    mult = 1e3;
  else if (suffix == "M")
    mult = 1e6;
  else if (suffix == "G")
    mult = 1e9;
  else if (!suffix.empty())
    return make_error(errc::invalid_argument, fmt::format("bandwidth '{}': bad suffix", s));
  if (!std::isfinite(v) || v < 0 || v * mult > 1e15)
    return make_error(errc::invalid_argument, fmt::format("bandwidth '{}': out of range", s));
  return static_cast<std::uint64_t>(v * mult);
}

namespace {
bool is_switch(const std::string& v, bool on) {
  static constexpr std::string_view kOn[] = {"on", "true", "1", ""};
  static constexpr std::string_view kOff[] = {"off", "false", "0"};
  if (on) return std::find(std::begin(kOn), std::end(kOn), v) != std::end(kOn);
  return std::find(std::begin(kOff), std::end(kOff), v) != std::end(kOff);
}
}  // namespace

bool metrics_enabled(const TrainOptions& o) {
  return !o.no_metrics && !is_switch(o.metrics, false);
}

std::string metrics_http_address(const TrainOptions& o) {
  if (!metrics_enabled(o) || is_switch(o.metrics, true)) return "";
  return o.metrics;
}

result<optim::OptimizerOptions> optimizer_options(const TrainOptions& o) {
  optim::OptimizerOptions oo;
  oo.run_id = o.run_id;
  oo.target_batch_size = o.target_batch_size;
  oo.batch_size = o.batch_size;
  oo.checkpoint_dir = o.checkpoint_dir;
  oo.diloco_steps = o.diloco_steps;
  oo.outer.lr = o.outer_lr;
  oo.outer.momentum = o.outer_momentum;
  oo.delay_optimizer_step = o.delay_step;
  ST_TRY(oo.delay_correction, optim::parse_delay_correction(o.delay_correction));
  oo.delay_max_backlog = o.max_backlog;
  oo.worker_momentum = o.worker_momentum;
  ST_TRY(oo.grad_compression, training::parse_compression(o.compression));
  ST_TRY(auto bw, parse_bandwidth(o.max_bandwidth));  // enforced by the node (train_net.cpp)
  (void)bw;
  oo.client_mode = o.client;
  oo.auxiliary = o.auxiliary;
  if (o.auxiliary && o.initial_peers.empty())
    return make_error(errc::invalid_argument,
                      "--auxiliary needs --initial-peers (it only helps others)");
  if (!(o.averaging_timeout > 0) || !(o.matchmaking_time > 0))
    return make_error(errc::invalid_argument, "timeouts must be positive");
  oo.averaging_timeout = seconds(o.averaging_timeout);
  oo.matchmaking_time = seconds(o.matchmaking_time);
  if (!(o.startup_grace >= 0))
    return make_error(errc::invalid_argument, "--startup-grace must be >= 0");
  oo.progress.startup_grace_min = seconds(o.startup_grace);
  if (o.threads < 1) return make_error(errc::invalid_argument, "--threads must be >= 1");
  ST_TRY(optim::validate(oo));
  return oo;
}

}  // namespace starling::cli
