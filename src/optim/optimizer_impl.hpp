// starling::Optimizer's private state (the training-thread side): accumulators, steps, state
// download and serving, and the delayed parameter updates (optimizer_delayed.cpp). Included
// only by the optimizer's own sources. Includes torch headers.
//
// Threading rule: the training thread owns everything here, except while a background round
// runs (delay_optimizer_step): then the background thread owns `master`, the inner optimizer
// and `bg` until bg->done is set (see BackgroundRound).
#pragma once

#include <torch/utils.h>

#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "optimizer_io.hpp"
#include "starling/core/log.hpp"
#include "starling/optim/diloco.hpp"
#include "starling/optim/optimizer.hpp"
#include "starling/optim/training_state.hpp"

namespace starling::optim {

struct Optimizer::Impl {
  static auto log() { return logger("optim"); }
  // How long the training thread waits for an io-thread job beyond the job's own deadline
  // before giving up on it (the io thread is stopped or wedged).
  static constexpr Duration kIoGrace = 30s;
  // After a failed round or download, wait this long before trying that again.
  static constexpr Duration kRetryBackoff = 2s;
  // status() reuses what the last step() learned from the tracker if it is this recent.
  static constexpr Duration kStatusFresh = 500ms;
  // Consecutive failed rounds after which the peer steps with its own gradients.
  static constexpr int kMaxFailedRounds = 3;

  torch::nn::Module& model;
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  std::unique_ptr<torch::optim::Optimizer> inner;
  OptimizerOptions opt;
  std::shared_ptr<OptimizerIo> io;                 // null: training alone
  std::unique_ptr<ProgressTracker> local_tracker;  // used when io is null

  // Gradient accumulators: sum over batches of (batch mean gradient x batch size), one flat
  // float32 buffer with a view per parameter.
  torch::Tensor acc_flat;
  std::vector<torch::Tensor> acc;
  std::int64_t numel = 0;

  DilocoState diloco;
  std::optional<CheckpointDir> ckpt;
  std::optional<CheckpointMeta> resumed;

  std::uint64_t epoch = 0;          // training-thread copy of the local epoch
  std::uint64_t digest = 0;         // StateDigest of the parameters at `epoch`
  std::uint64_t local_samples = 0;  // toward `epoch`
  std::optional<TimePoint> last_step_end;
  // Not before these: a round after a failed one, a download after a failed one. They are
  // apart: a round that failed because the peers moved on is followed by a download at once
  // (the collaboration steps every few hundred ms on a fast machine; waiting 2 s there put a
  // joiner many epochs behind again, download after download).
  TimePoint round_retry_after{};
  TimePoint download_retry_after{};
  int failed_rounds = 0;
  bool shut_down = false;
  OptimizerStatus stats;
  // The tracker's part of the status as of tracker_status_at (written on the io thread while the
  // training thread waits for it, in step() and status()).
  OptimizerStatus tracker_status;
  TimePoint tracker_status_at{};

  void note_tracker(const ProgressTracker& t, const CollaborationView& v) {
    tracker_status.local_epoch = t.local_epoch();
    tracker_status.local_samples = t.local_samples();
    tracker_status.samples_total = t.samples_total();
    tracker_status.local_samples_per_second = t.local_samples_per_second();
    tracker_status.collaboration = v;
    tracker_status_at = Clock::now();
  }

  // Delayed parameter updates (optimizer_delayed.cpp): the inner optimizer steps `master`,
  // copies of the parameters, so that a step in the background never touches the tensors the
  // training thread computes with; the training thread copies master into the parameters
  // (under master_mu) when it applies the finished step. Empty unless delay_optimizer_step.
  std::vector<torch::Tensor> master;
  std::mutex master_mu;
  struct BackgroundRound;
  std::shared_ptr<BackgroundRound> bg;  // the round in flight (training thread)

  Impl(torch::nn::Module& m, std::unique_ptr<torch::optim::Optimizer> in, OptimizerOptions o)
      : model(m), inner(std::move(in)), opt(std::move(o)) {}
  ~Impl();

  bool delayed() const { return !master.empty(); }
  // The tensors the inner optimizer steps.
  std::vector<torch::Tensor>& stepped_params() { return delayed() ? master : params; }
  // --- optimizer_delayed.cpp ---
  // Switches the inner optimizer to master copies of the parameters (moving any state it holds).
  void init_master();
  // Copies master into the parameters (delayed mode; no-op otherwise), or the other way round.
  void publish_master();
  void reload_master();
  // Starts the round of this epoch and its step in the background (the accumulators restart
  // at zero for the next epoch).
  void start_background_round(StepReport& rep, const CollaborationView& v);
  // Applies the background round's outcome if it has finished (or waits for it with `block`).
  // Returns whether a round was finished.
  bool finish_background_round(StepReport& rep, bool block);
  void run_background_round(BackgroundRound& b);
  bool background_step_applied() const;  // master_mu held

  ProgressConfig progress_config() const {
    ProgressConfig c = opt.progress;
    c.target_batch_size = opt.target_batch_size;
    c.per_peer_target = opt.diloco_steps > 0 ? std::uint64_t{opt.diloco_steps} * opt.batch_size : 0;
    c.matchmaking_time = opt.matchmaking_time;
    c.auxiliary = opt.auxiliary;
    c.client_mode = opt.client_mode;
    c.delayed_updates = opt.delay_optimizer_step;
    return c;
  }

  // The digest of the parameters (the collaboration's state at an epoch boundary: in delayed
  // mode master was just published into them, in DiLoCo mode they equal the anchors).
  std::uint64_t compute_digest() {
    torch::NoGradGuard no_grad;
    StateDigest d;
    for (const auto& p : params) {
      auto t = p.detach().to(torch::kCPU, torch::kFloat32).contiguous();
      d.update(t.data_ptr<float>(), static_cast<std::size_t>(t.numel()) * sizeof(float));
    }
    return d.value();
  }

  static std::vector<net::PeerId> member_ids(const RoundResult& r) {
    std::vector<net::PeerId> ids;
    for (const auto& m : r.members) ids.push_back(m.peer);
    return ids;
  }

  // Runs `f(tracker)` where the tracker lives: the io thread, or here when alone.
  template <class F>
  auto with_tracker(F&& f) {
    if (io) return io->run([&](ProgressTracker& t) { return f(t); });
    return f(*local_tracker);
  }

  NamedTensors extra_tensors() {
    NamedTensors extra;
    if (opt.diloco_steps == 0) return extra;
    if (diloco.anchors().size() != params.size()) diloco.reset(params);
    for (std::size_t i = 0; i < params.size(); ++i) {
      extra.emplace_back(fmt::format("anchor_{}", i), diloco.anchors()[i]);
      if (!diloco.momentum()[i].defined()) diloco.momentum()[i] = torch::zeros_like(params[i]);
      extra.emplace_back(fmt::format("outer_momentum_{}", i), diloco.momentum()[i]);
    }
    return extra;
  }

  void accumulate(std::size_t batch_size) {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto& g = params[i].mutable_grad();
      if (!g.defined()) continue;
      acc[i].add_(g.detach().to(torch::kCPU, torch::kFloat32).view_as(acc[i]),
                  static_cast<double>(batch_size));
      g.zero_();
    }
  }

  // Puts `grads` (flat float32, the gradient to apply) into .grad and steps the inner optimizer.
  void apply_inner_step(const torch::Tensor& grads_flat) {
    {
      torch::NoGradGuard no_grad;
      std::int64_t off = 0;
      for (auto& p : stepped_params()) {
        auto n = p.numel();
        auto g = grads_flat.narrow(0, off, n).view(p.sizes()).to(p.device(), p.scalar_type());
        if (p.mutable_grad().defined())
          p.mutable_grad().copy_(g);
        else
          p.mutable_grad() = g.clone();
        off += n;
      }
    }
    inner->step();
    for (auto& p : stepped_params())
      if (p.mutable_grad().defined()) p.mutable_grad().zero_();
  }

  // The local epoch becomes `new_epoch` (stepped, or state downloaded); `round`: the round
  // whose step got it there (its members are at the new epoch too).
  void finish_epoch(std::uint64_t new_epoch, const RoundResult* round = nullptr) {
    acc_flat.zero_();
    local_samples = 0;
    digest = compute_digest();
    std::vector<net::PeerId> members;
    if (round) members = member_ids(*round);
    with_tracker([&](ProgressTracker& t) {
      t.set_epoch(new_epoch);
      t.set_digest(digest);
      if (!members.empty()) t.round_succeeded(members, Clock::now());
      return 0;
    });
    enter_epoch(new_epoch);
  }

  // The local epoch is now `new_epoch` (the tracker already knows).
  void enter_epoch(std::uint64_t new_epoch) {
    epoch = new_epoch;
    // Failures count per epoch: a new epoch (stepped or downloaded) starts clean.
    failed_rounds = 0;
    if (io) io->state_changed(epoch);
    if (ckpt && opt.checkpoint_every > 0 && epoch % opt.checkpoint_every == 0) {
      auto r = save(0, 0);
      if (!r) log()->warn("checkpoint at epoch {} failed: {}", epoch, r.error().message());
    }
  }

  // The flat tensor this peer contributes to a round: mean gradient (DeDLOC) or
  // pseudo-gradient (DiLoCo).
  torch::Tensor contribution() {
    torch::NoGradGuard no_grad;
    if (opt.diloco_steps > 0) {
      auto pg = diloco.pseudo_gradient(params);
      std::vector<torch::Tensor> flat;
      for (auto& t : pg) flat.push_back(t.detach().to(torch::kCPU, torch::kFloat32).reshape({-1}));
      return torch::cat(flat);
    }
    if (local_samples == 0) return torch::zeros_like(acc_flat);
    return acc_flat / static_cast<double>(local_samples);
  }

  // Applies the collaboration's (or this peer's own) averaged contribution.
  void apply(const torch::Tensor& averaged) {
    if (opt.diloco_steps > 0) {
      std::vector<torch::Tensor> g;
      std::int64_t off = 0;
      for (auto& p : params) {
        g.push_back(
            averaged.narrow(0, off, p.numel()).view(p.sizes()).to(p.device(), p.scalar_type()));
        off += p.numel();
      }
      diloco.outer_step(params, g, opt.outer);
    } else {
      apply_inner_step(averaged);
    }
  }

  // The key of this epoch's averaging round: peers at other epochs never join it.
  std::string round_key() const {
    return fmt::format("{}/{}", opt.diloco_steps > 0 ? "outer" : "grads", epoch);
  }

  void step_alone(StepReport& rep) {
    auto c = contribution();
    rep.group_size = 1;
    rep.group_samples = static_cast<double>(local_samples);
    apply(c);
    publish_master();
    rep.stepped = true;
    finish_epoch(epoch + 1);
  }

  // The peers this epoch's round expects, from the view of the decision that began it: a
  // majority of those at the epoch or one behind must be in the group; if every live peer is at
  // the epoch (or far behind), the round may begin as soon as all of them are. Until session 13
  // the majority was of the peers at the epoch only: two peers that had just downloaded the
  // state saw the other two one behind (their records lagged), each pair counted two and both
  // stepped (a fork, once under load 60). A majority of every live peer (67de67e, reverted)
  // also waited for peers far behind, who must download first.
  void expect_members(RoundOptions& ro, const CollaborationView& v) const {
    ro.expected_members = v.majority_base;
    ro.expected_group = v.global_epoch == epoch ? v.all_at_epoch : 0;
  }

  // The buffer and options of this epoch's round over `mine` (averaged in place), with the
  // peers `v` (the decision's view, at this epoch) expects.
  std::pair<std::shared_ptr<RoundBuffer>, RoundOptions> make_round(torch::Tensor mine,
                                                                   const CollaborationView& v) {
    auto buf = std::make_shared<RoundBuffer>();
    buf->data = mine.data_ptr<float>();
    buf->size = static_cast<std::size_t>(mine.numel());
    buf->owner = std::make_shared<torch::Tensor>(std::move(mine));
    buf->names = names;
    for (auto& p : params) buf->sizes.push_back(p.numel());
    RoundOptions ro;
    ro.key = round_key();
    ro.weight = static_cast<double>(local_samples);
    ro.deadline = Clock::now() + opt.averaging_timeout;
    ro.compression = opt.grad_compression;
    expect_members(ro, v);
    return {std::move(buf), std::move(ro)};
  }

  // Early matchmaking: the collaboration expects the target in view.eta; the collaboration
  // may form this epoch's group now (average() later brings the data).
  void prepare_round(const CollaborationView& v) {
    if (!io || !v.eta) return;
    RoundPlan p;
    p.expected_start = Clock::now() + *v.eta;
    p.options.key = round_key();
    p.options.weight = opt.auxiliary ? 0.0 : static_cast<double>(local_samples);
    p.options.deadline = p.expected_start + opt.averaging_timeout;
    p.options.compression = opt.grad_compression;
    expect_members(p.options, v);
    for (std::size_t i = 0; i < params.size(); ++i)
      p.layout.emplace_back(names[i], static_cast<std::size_t>(params[i].numel()));
    io->prepare_round(std::move(p));
  }

  // Runs a round on the io thread (blocking this thread, bounded); a group of one is a failure.
  // `serve`: the calling (training) thread serves state requests while it waits.
  result<RoundResult> run_round(const std::shared_ptr<RoundBuffer>& buf, const RoundOptions& ro,
                                bool serve = false) {
    std::function<void()> waiting;
    if (serve) waiting = [this] { serve_pending_state_request(); };
    auto r = io->average(buf, ro, opt.averaging_timeout + kIoGrace, std::move(waiting));
    // A group of one means the others were not there (they stepped already, or are behind):
    // applying our own gradients alone would fork the parameters at this epoch.
    if (r && r.value().members.size() < 2)
      r = make_error(errc::unavailable, fmt::format("round {}: no other peer joined", ro.key));
    return r;
  }

  void note_round(StepReport& rep, const RoundResult& r) {
    ++stats.rounds_ok;
    rep.group_size = r.members.size();
    rep.group_samples = r.total_weight;
    rep.bytes_sent = r.bytes_sent;
    rep.bytes_received = r.bytes_received;
  }

  // A round failed: retry after a pause; after kMaxFailedRounds, if no other live peer is at
  // this epoch and a fetch begun after the failure's hold confirmed it (a failed round
  // disturbs the view: ProgressTracker::round_failed), step with the own gradients.
  void round_failed(StepReport& rep, const Error& e) {
    rep.round_error = e;
    ++stats.rounds_failed;
    round_retry_after = Clock::now() + kRetryBackoff;
    const bool alone = with_tracker([](ProgressTracker& t) {
      t.round_failed(Clock::now());
      return t.may_step_alone(Clock::now());
    });
    if (++failed_rounds < kMaxFailedRounds) {
      log()->info("epoch {}: averaging failed: {}", epoch, e.message());
    } else if (!alone) {
      // Live peers are at this epoch (or being alone is not confirmed yet): stepping alone
      // would fork the parameters. Keep trying; if they step without this peer, it falls
      // behind and downloads their state; if it is really alone, decide() steps alone.
      log()->warn(
          "epoch {}: {} averaging rounds failed (last: {}); peers may be at this epoch, "
          "not stepping alone",
          epoch, failed_rounds, e.message());
    } else {
      log()->warn(
          "epoch {}: {} averaging rounds failed (last: {}); alone, stepping with local "
          "data",
          epoch, failed_rounds, e.message());
      step_alone(rep);
    }
  }

  void average_and_step(StepReport& rep, const CollaborationView& v) {
    if (Clock::now() < round_retry_after) return;
    torch::Tensor mine = contribution().contiguous();
    auto [buf, ro] = make_round(mine, v);
    auto t0 = Clock::now();
    auto r = run_round(buf, ro, true);  // the parameters do not change meanwhile
    rep.averaging_time = Clock::now() - t0;
    if (!r) {
      round_failed(rep, r.error());
      return;
    }
    note_round(rep, r.value());
    apply(mine);  // averaged in place
    publish_master();
    rep.stepped = true;
    finish_epoch(epoch + 1, &r.value());
  }

  // Downloads the collaboration's state: it is ahead, or (want_digest != 0) it is at this
  // epoch with other parameters than this peer's (a fork), and holds want_digest.
  void download(StepReport& rep, std::uint64_t want_digest = 0) {
    if (Clock::now() < download_retry_after) return;
    if (want_digest != 0)
      log()->info("epoch {}: parameters forked (digest {:016x}, most peers {:016x}): downloading",
                  epoch, digest, want_digest);
    auto r =
        io->download_state(opt.load_state_timeout, opt.load_state_timeout + kIoGrace, want_digest);
    if (r && (r.value().epoch < epoch ||
              (r.value().epoch == epoch && r.value().digest != 0 && r.value().digest == digest)))
      r = make_error(errc::unavailable,
                     fmt::format("the donors' state (epoch {}) is not newer than this peer's",
                                 r.value().epoch));
    if (r) {
      NamedTensors extra = extra_tensors();
      auto ok = load_training_state(r.value().bytes, model, inner.get(), &extra);
      if (ok) {
        ++stats.state_downloads;
        reload_master();
        if (opt.diloco_steps > 0) {
          // The collaboration's state is the anchors: continue from them.
          torch::NoGradGuard no_grad;
          for (std::size_t i = 0; i < params.size(); ++i)
            params[i].detach().copy_(diloco.anchors()[i]);
        }
        log()->info("loaded state of epoch {} from peers ({} bytes)", r.value().epoch,
                    r.value().bytes.size());
        finish_epoch(r.value().epoch);
        rep.epoch = epoch;
        return;
      }
      r = ok.error();
    }
    rep.round_error = r.error();
    download_retry_after = Clock::now() + kRetryBackoff;
    log()->warn("epoch {}: state download failed: {}", epoch, r.error().message());
  }

  result<std::filesystem::path> save(std::uint64_t pass, std::uint64_t position) {
    if (!ckpt) return make_error(errc::invalid_argument, "no checkpoint directory configured");
    if (bg) {
      // The background step owns the optimizer state: apply it first.
      StepReport ignored;
      finish_background_round(ignored, true);
    }
    CheckpointMeta m;
    m.run_id = opt.run_id;
    m.epoch = epoch;
    m.samples_accumulated = local_samples;
    m.samples_total = with_tracker([](ProgressTracker& t) { return t.samples_total(); });
    m.stream_pass = pass;
    m.stream_position = position;
    m.outer_steps = diloco.outer_steps();
    return optim::save_checkpoint(*ckpt, m, model, inner.get(), extra_tensors());
  }

  // Training thread: serialises the state for a peer that asked (at every step() call, and
  // every 20 ms while a synchronous round is in flight, so a peer behind is never held up by
  // this one's round). With a background round in flight the parameters and the optimizer
  // state are those of `epoch` until its step is applied (under master_mu): served under that
  // lock; once applied, at the next call after it was published.
  void serve_pending_state_request() {
    if (!io || !io->state_requested()) return;
    std::unique_lock<std::mutex> lk;
    if (bg) {
      lk = std::unique_lock(master_mu);
      if (background_step_applied()) return;
    }
    auto bytes = save_training_state(model, inner.get(), extra_tensors());
    if (!bytes) {
      log()->warn("cannot serialise state for a peer: {}", bytes.error().message());
      return;
    }
    io->offer_state(epoch, digest, std::move(bytes).value());
  }
};

}  // namespace starling::optim
