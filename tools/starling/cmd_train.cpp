// `starling train`: joins (or starts) a collaboration on a built-in task (train_task.hpp) and
// trains until stopped, with a live progress line. The only CLI translation unit with torch.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include <torch/utils.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "starling/core/log.hpp"
#include "starling/crypto/keys.hpp"
#include "starling/optim/optimizer.hpp"
#include "starling/training/checkpoint.hpp"
#include "starling/training/round_budget.hpp"
#include "train_bench_hooks.hpp"
#include "train_grad_check.hpp"
#include "train_metrics.hpp"
#include "train_options.hpp"
#include "train_task.hpp"

namespace starling::cli {
namespace {

std::atomic<int> g_signals{0};

extern "C" void on_train_signal(int) {
  if (g_signals.fetch_add(1) >= 1) std::_Exit(130);  // second Ctrl-C: leave at once
}

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_train_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// A short hash of every parameter's bytes, in order: peers that hold identical parameters
// print the same value.
std::string parameter_hash(torch::nn::Module& model) {
  Bytes all;
  for (auto& p : model.parameters()) {
    auto t = p.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    auto* b = reinterpret_cast<const std::uint8_t*>(t.data_ptr<float>());
    all.insert(all.end(), b, b + t.numel() * sizeof(float));
  }
  auto h = crypto::sha256(all);
  return to_hex(BytesView(h.data(), 8));
}

// Evaluates the collaboration's parameters (with delayed updates the model may hold the
// extrapolated parameters gradients are computed at).
TaskEvaluation evaluate(TrainTask& task, optim::Optimizer& opt) {
  TaskEvaluation ev;
  opt.with_collaboration_parameters([&] { ev = task.evaluate(); });
  return ev;
}

std::string format_eta(std::optional<double> s) {
  if (!s || !std::isfinite(*s)) return "?";
  if (*s >= 3600) return fmt::format("{:.1f}h", *s / 3600);
  if (*s >= 60) return fmt::format("{:.1f}m", *s / 60);
  return fmt::format("{:.0f}s", *s);
}

struct Progress {
  bool tty = isatty(STDERR_FILENO) != 0;
  Duration every{2s};
  TimePoint last{};
  double loss_ema = 0;
  bool have_loss = false;

  void loss(double l) {
    loss_ema = have_loss ? 0.95 * loss_ema + 0.05 * l : l;
    have_loss = true;
  }
  void print(const optim::OptimizerStatus& s, const TrainOptions& o, bool force) {
    const auto now = Clock::now();
    if (!force && now - last < (tty ? Duration(500ms) : every)) return;
    last = now;
    const auto& v = s.collaboration;
    std::optional<double> eta;
    if (o.max_epochs > v.global_epoch && v.samples_per_second > 0) {
      const double left =
          static_cast<double>(o.max_epochs - v.global_epoch) * static_cast<double>(v.target) -
          static_cast<double>(v.samples_accumulated);
      eta = std::max(0.0, left) / v.samples_per_second;
    } else if (v.eta) {
      eta = std::chrono::duration<double>(*v.eta).count();
    }
    auto line = fmt::format(
        "epoch {} | {:.0f} samples/s ({} peers) | {}/{} samples | loss {:.4f} | {} {} | sent "
        "{:.1f} MB",
        s.local_epoch, v.samples_per_second, v.num_peers, v.samples_accumulated, v.target, loss_ema,
        o.max_epochs > 0 ? "ETA" : "next step", format_eta(eta),
        static_cast<double>(s.bytes_sent) / 1e6);
    if (tty)
      std::cerr << "\r" << line << "\x1b[K" << std::flush;
    else
      std::cerr << line << "\n" << std::flush;
  }
};

int train_main(const TrainOptions& o) {
  auto oo = optimizer_options(o);
  if (!oo) {
    std::cerr << "error: " << oo.error().message() << "\n";
    return 2;
  }
  if ((o.target_accuracy > 0 || o.stop_at_target) && o.eval_every == 0) {
    std::cerr << "error: --target-accuracy and --stop-at-target need --eval-every N\n";
    return 2;
  }
  if (o.stop_at_target && o.target_accuracy <= 0) {
    std::cerr << "error: --stop-at-target needs --target-accuracy\n";
    return 2;
  }
  auto loaded = load_train_task(o);
  if (!loaded) {
    std::cerr << "error: " << loaded.error().message() << "\n";
    return 2;
  }
  auto& task = *loaded.value();
  torch::set_num_threads(o.threads);
  install_signal_handlers();

  auto net = start_train_network(o);
  if (!net) {
    std::cerr << "error: " << net.error().message() << "\n";
    return 2;
  }
  const std::string peer = net.value()->peer_id();
  if (auto same = net.value()->check_run_identity(task.identity()); !same) {
    std::cerr << "error: " << same.error().message() << "\n";
    net.value()->stop();
    return 2;
  }
  if (auto c = task.connect(*net.value()); !c) {
    std::cerr << "error: " << c.error().message() << "\n";
    net.value()->stop();
    return 2;
  }
  const std::uint64_t data_seed =
      o.data_seed != 0 ? o.data_seed : training::seed_from_bytes(as_bytes(peer));
  task.start(data_seed);
  std::unique_ptr<TrainGradCheck> grad_check;
  if (o.grad_check > 0 && net.value()->collaboration()) {
    auto g = TrainGradCheck::create(o, task, peer);
    if (!g) {
      std::cerr << "error: " << g.error().message() << "\n";
      net.value()->stop();
      return 2;
    }
    grad_check = std::move(g).value();
    grad_check->install(oo.value());
  }
  auto inner = task.make_optimizer();
  if (!inner) {
    std::cerr << "error: " << inner.error().message() << "\n";
    net.value()->stop();
    return 2;
  }
  // Benchmarks: the trainers start their clocks (and their startup grace) together.
  if (!o.start_barrier.empty()) {
    if (auto b = wait_start_barrier(o.start_barrier, 120); !b) {
      std::cerr << "error: " << b.error().message() << "\n";
      net.value()->stop();
      return 2;
    }
  }
  auto created = optim::Optimizer::create(task.module(), std::move(inner).value(), oo.value(),
                                          net.value()->collaboration());
  if (!created) {
    std::cerr << "error: " << created.error().message() << "\n";
    net.value()->stop();
    return 2;
  }
  auto& opt = *created.value();
  if (auto& r = opt.resumed_from()) {
    task.stream().seek(r->stream_pass, r->stream_position);
    std::cerr << "resumed from checkpoint at epoch " << r->epoch << "\n";
  }
  std::cout << "peer " << peer << " run " << o.run_id << " " << task.describe()
            << (net.value()->collaboration() ? "" : " (training alone)") << std::endl;
  for (const auto& a : net.value()->addresses()) std::cout << "listening on " << a << std::endl;

  auto metrics_started = TrainerMetrics::start(o, *net.value());
  if (!metrics_started) {
    std::cerr << "error: " << metrics_started.error().message() << "\n";
    (void)opt.shutdown(10s);
    net.value()->stop();
    return 2;
  }
  auto& metrics = *metrics_started.value();
  metrics.set_task(task.identity());
  if (auto url = metrics.endpoint_url(); !url.empty()) std::cout << "metrics " << url << std::endl;
  Progress progress;
  progress.every = seconds(std::max(0.1, o.progress_every));
  const auto t0 = Clock::now();
  std::uint64_t last_eval_epoch = opt.local_epoch();
  // Time to accuracy: wall time from the start (evaluations included) and the time spent in
  // evaluations, at the first evaluation that reached the target.
  TimeToTarget ttt;
  if (o.task == "lm" && o.eval_every > 0) {
    const auto ev = evaluate(task, opt);
    std::cerr << fmt::format("epoch {} (start): {}\n", opt.local_epoch(), ev.describe());
    metrics.evaluated(ev.accuracy, ev.loss, opt.local_epoch(), ev.perplexity);
  }
  std::string stop_reason = "interrupted";
  // Two trainers of different tasks started together saw no record of each other at start.
  std::optional<IdentityWatch> identity_watch;
  if (net.value()->collaboration())
    identity_watch.emplace(*net.value(), task.identity(),
                           seconds(std::max(2.0, o.metrics_interval)));
  const auto train_log = logger("train");
  // Warns once when rounds dominate this peer's time (synchronous and delayed DeDLOC steps).
  training::RoundBudget budget(o.target_batch_size, o.batch_size, o.delay_step);
  const bool judge_rounds = net.value()->collaboration() && o.diloco_steps == 0 && !o.auxiliary;
  std::uint64_t logged_epoch = opt.local_epoch();
  while (g_signals.load() == 0) {
    // An auxiliary peer computes nothing: it follows the collaboration and joins its rounds.
    auto rep = [&] {
      if (o.auxiliary) return opt.assist();
      task.set_epoch(opt.local_epoch());  // the LR schedule's epoch
      const auto c0 = Clock::now();
      double loss = 0;
      try {
        loss = grad_check ? grad_check->forward_backward(opt.local_epoch(), opt.epoch_samples(),
                                                         o.batch_size)
                          : task.forward_backward(o.batch_size);
      } catch (const std::exception& e) {  // fashion-moe: no expert answered
        return decltype(opt.step(0))(Error(errc::unavailable, e.what()));
      }
      budget.computed(Clock::now() - c0, o.batch_size);
      progress.loss(loss);
      metrics.loss(loss);
      return opt.step(o.batch_size);
    }();
    if (o.auxiliary && rep && !rep.value().stepped) std::this_thread::sleep_for(20ms);
    if (!rep) {
      std::cerr << "\nerror: " << rep.error().message() << "\n";
      stop_reason = "error";
      break;
    }
    if (auto conflict = identity_watch ? identity_watch->poll() : std::nullopt) {
      std::cerr << "\nerror: " << conflict->message() << "\n";
      stop_reason = "identity-conflict";
      break;
    }
    if (opt.local_epoch() != logged_epoch) {
      // Each epoch's origin and the optimizer's state digest (STARLING_LOG=info; computed
      // once per epoch by the optimizer): peers that agree print the same digest at the same
      // epoch, so a fork shows where it began.
      if (train_log->should_log(spdlog::level::info)) {
        const auto& r = rep.value();
        const char* how = !r.stepped ? "downloaded" : r.group_size > 1 ? "averaged" : "alone";
        train_log->info("epoch {} -> {}: {} (group {}, {:.0f} samples) digest {:016x}",
                        logged_epoch, opt.local_epoch(), how, r.group_size, r.group_samples,
                        opt.state_digest());
      }
      logged_epoch = opt.local_epoch();
    }
    metrics.step(rep.value());
    if (const auto rt = rep.value().matchmaking_time + rep.value().allreduce_time;
        judge_rounds && rt > Duration::zero()) {
      budget.round(rt);
      if (auto advice = budget.advice())
        std::cerr << (progress.tty ? "\n" : "") << "warning: " << advice->message << "\n";
    }
    auto st = opt.status();
    progress.print(st, o, false);
    metrics.status(st);
    if (rep.value().stepped && o.eval_every > 0 &&
        rep.value().epoch >= last_eval_epoch + o.eval_every) {
      last_eval_epoch = rep.value().epoch;
      const auto ev = ttt.evaluation(o.eval_pause_file, [&] { return evaluate(task, opt); });
      const double at = ttt.elapsed();
      std::cerr << (progress.tty ? "\n" : "")
                << fmt::format("epoch {}: {} at {:.1f} s\n", rep.value().epoch, ev.describe(), at);
      metrics.evaluated(ev.accuracy, ev.loss, rep.value().epoch, ev.perplexity);
      if (o.target_accuracy > 0 && ev.accuracy >= o.target_accuracy &&
          ttt.reach(rep.value().epoch)) {
        std::cerr << fmt::format(
            "reached test accuracy {:.4f} (target {}) at epoch {} in {:.1f} s "
            "({:.1f} s of it evaluating)\n",
            ev.accuracy, o.target_accuracy, rep.value().epoch, at, ttt.eval_seconds());
        if (o.stop_at_target) {
          stop_reason = "target-accuracy";
          break;
        }
      }
    }
    if (o.max_epochs > 0 && opt.local_epoch() >= o.max_epochs) {
      stop_reason = "max-epochs";
      break;
    }
    if (o.max_samples > 0 && st.samples_total >= o.max_samples) {
      stop_reason = "max-samples";
      break;
    }
    if (o.max_seconds > 0 && Clock::now() - t0 > std::chrono::duration<double>(o.max_seconds)) {
      stop_reason = "max-seconds";
      break;
    }
  }
  ttt.end_training();
  if (progress.tty) std::cerr << "\n";
  const bool finished =
      stop_reason != "interrupted" && stop_reason != "error" && stop_reason != "identity-conflict";
  identity_watch.reset();
  // Delayed updates: a round still in flight is finished and applied before reporting or
  // lingering (the others count on this peer in it, and it serves no state meanwhile).
  if (finished) opt.finish_round();
  if (net.value()->collaboration() && finished && o.linger > 0) {
    // Stay a moment so that peers still behind (a failed last round) can download the final
    // state instead of finishing on their own: until every live peer is at our epoch.
    std::cerr << "lingering (up to " << o.linger << " s) while peers catch up..." << std::endl;
    const auto start = Clock::now();
    const auto until = start + std::chrono::duration<double>(o.linger);
    while (g_signals.load() == 0 && Clock::now() < until) {
      opt.serve_state_requests();
      const auto v = opt.status().collaboration;
      if (Clock::now() - start > 3s && v.peers_at_global_epoch >= v.num_peers) break;
      std::this_thread::sleep_for(50ms);
    }
  }
  std::cerr << "leaving (" << stop_reason << ")..." << std::endl;
  auto final_status = opt.status();
  // fashion-moe evaluates through remote experts: before the node stops.
  std::optional<TaskEvaluation> early;
  if (o.task == "fashion-moe") early = evaluate(task, opt);
  metrics.stop();
  auto down = opt.shutdown(10s);
  if (!down) std::cerr << "warning: shutdown: " << down.error().message() << "\n";
  net.value()->stop();
  // Networked: count everything the collaboration moved (rounds and state served).
  if (auto [tx, rx] = net.value()->traffic(); tx > 0 || rx > 0) {
    final_status.bytes_sent = tx;
    final_status.bytes_received = rx;
  }

  const auto ev = early ? *early : evaluate(task, opt);
  if (auto s = task.summary(); !s.empty()) std::cout << s << std::endl;
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string hash = parameter_hash(task.module());
  const std::string quality = ev.perplexity
                                  ? fmt::format("heldout_perplexity {:.3f}", *ev.perplexity)
                                  : fmt::format("test_accuracy {:.4f}", ev.accuracy);
  std::cout << fmt::format(
                   "done: epoch {} {} samples {} bytes_sent {} "
                   "rounds {}/{} state_downloads {} seconds {:.1f} param_hash {}",
                   opt.local_epoch(), quality, final_status.samples_total, final_status.bytes_sent,
                   final_status.rounds_ok, final_status.rounds_ok + final_status.rounds_failed,
                   final_status.state_downloads, secs, hash)
            << std::endl;
  if (!o.report.empty()) {
    const double step_secs = std::chrono::duration<double>(final_status.step_time).count();
    nlohmann::json j = {{"peer", peer},
                        {"stop", stop_reason},
                        {"epoch", opt.local_epoch()},
                        {"test_accuracy", ev.accuracy},
                        {"test_loss", ev.loss},
                        {"samples", final_status.samples_total},
                        {"bytes_sent", final_status.bytes_sent},
                        {"bytes_received", final_status.bytes_received},
                        {"rounds_ok", final_status.rounds_ok},
                        {"rounds_failed", final_status.rounds_failed},
                        {"rounds_joined_early", final_status.rounds_joined_early},
                        {"samples_dropped", final_status.samples_dropped},
                        {"state_downloads", final_status.state_downloads},
                        {"seconds", secs},
                        {"step_seconds", step_secs},
                        {"param_hash", hash}};
    if (grad_check) {
      j["grad_checks"] = final_status.grad_checks;
      j["grad_check_failures"] = final_status.grad_check_failures;
      j["grad_check_seconds"] = std::chrono::duration<double>(final_status.grad_check_time).count();
    }
    if (ev.perplexity) {
      j["heldout_perplexity"] = *ev.perplexity;
      j["heldout_loss"] = ev.loss;
      j["heldout_accuracy"] = ev.accuracy;
    }
    if (o.target_accuracy > 0) j["target_accuracy"] = o.target_accuracy;
    ttt.report(j, o.target_accuracy > 0);
    const std::string text = j.dump() + "\n";
    auto w = training::write_file_atomic(o.report, as_bytes(text));
    if (!w) std::cerr << "error: report: " << w.error().message() << "\n";
  }
  if (stop_reason == "identity-conflict") return 2;  // as when refused at start
  return stop_reason == "error" ? 1 : 0;
}

}  // namespace

void add_train_command(CLI::App& app, Runner& run) {
  auto o = std::make_shared<TrainOptions>();
  auto* cmd = app.add_subcommand(
      "train",
      "join or start a collaboration training a built-in task (Fashion-MNIST, or a language "
      "model with --task lm)");
  add_train_flags(*cmd, *o);
  cmd->callback([&run, o, cmd] {
    auto resolve = [&]() -> result<void> {
      if (!o->config.empty()) ST_TRY(apply_train_config(*cmd, o->config));
      return resolve_task_defaults(*o);
    };
    if (auto r = resolve(); !r) {
      std::cerr << "error: " << r.error().message() << "\n";
      run = [] { return 2; };
      return;
    }
    run = [o] { return train_main(*o); };
  });
}

}  // namespace starling::cli
