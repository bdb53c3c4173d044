// starling::Optimizer's private state (the training-thread side): accumulators, steps, state
// download and serving, and the delayed parameter updates (optimizer_delayed.cpp). Included
// only by the optimizer's own sources. Includes torch headers.
//
// Threading rule: the training thread owns everything here, except while a background round
// runs (delay_optimizer_step): then the background worker (`bg_worker`, one thread for the
// optimizer's life) owns `master`, the inner optimizer and `bg` until bg->done is set (see
// BackgroundRound).
#pragma once

#include <torch/utils.h>

#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "optimizer_io.hpp"
#include "starling/core/log.hpp"
#include "starling/core/thread_pool.hpp"
#include "starling/optim/diloco.hpp"
#include "starling/optim/optimizer.hpp"
#include "starling/optim/training_state.hpp"

namespace starling::optim {

struct Optimizer::Impl {
  static auto log() { return logger("optim"); }
  // status() reuses what the last step() learned from the tracker if it is this recent.
  static constexpr Duration kStatusFresh = 500ms;

  torch::nn::Module& model;
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  std::unique_ptr<torch::optim::Optimizer> inner;
  OptimizerOptions opt;
  std::shared_ptr<OptimizerIo> io;                           // null: training alone
  std::unique_ptr<training::ProgressTracker> local_tracker;  // used when io is null

  // Gradient accumulators: sum over batches of (batch mean gradient x batch size), one flat
  // float32 buffer with a view per parameter.
  torch::Tensor acc_flat;
  std::vector<torch::Tensor> acc;
  std::int64_t numel = 0;

  DilocoState diloco;
  std::optional<training::CheckpointDir> ckpt;
  std::optional<training::CheckpointMeta> resumed;

  std::uint64_t epoch = 0;          // training-thread copy of the local epoch
  std::uint64_t digest = 0;         // training::StateDigest of the parameters at `epoch`
  std::uint64_t local_samples = 0;  // toward `epoch`
  // OptimizerOptions::worker_momentum: the average committed after the last applied round
  // (undefined before the first), how many gradients it holds, and the one the last
  // contribution() computed (committed by commit_contribution() once its round is applied).
  torch::Tensor momentum, momentum_pending;
  std::uint64_t momentum_count = 0;
  std::optional<TimePoint> last_step_end;
  // Not before these: a round after a failed one, a download after a failed one. They are
  // apart: a round that failed because the peers moved on is followed by a download at once
  // (the collaboration steps every few hundred ms on a fast machine; waiting 2 s there put a
  // joiner many epochs behind again, download after download).
  TimePoint round_retry_after{};
  TimePoint download_retry_after{};
  std::uint32_t failed_rounds = 0;
  bool shut_down = false;
  OptimizerStatus stats;
  // The tracker's part of the status as of tracker_status_at (written on the io thread while the
  // training thread waits for it, in step() and status()).
  OptimizerStatus tracker_status;
  TimePoint tracker_status_at{};

  void note_tracker(const training::ProgressTracker& t, const training::CollaborationView& v) {
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
  // With a DelayCorrection: master before the last step applied to it (so the last step is
  // master - prev_master), and whether the parameters hold other values than master (the
  // prediction master + (master - prev_master), or master after a local step).
  std::vector<torch::Tensor> prev_master;
  bool predicted = false;
  std::mutex master_mu;
  struct BackgroundRound;
  std::shared_ptr<BackgroundRound> bg;  // the round in flight (training thread)
  // Runs the background rounds, one at a time (created with the master copies).
  std::unique_ptr<ThreadPool> bg_worker;

  Impl(torch::nn::Module& m, std::unique_ptr<torch::optim::Optimizer> in, OptimizerOptions o)
      : model(m), inner(std::move(in)), opt(std::move(o)) {}
  ~Impl();

  // The optimizer whose state the state format carries (null: its state is in the model).
  torch::optim::Optimizer* state_optimizer() {
    return opt.optimizer_state_in_model ? nullptr : inner.get();
  }
  bool delayed() const { return !master.empty(); }
  bool predicting() const { return delayed() && opt.delay_correction == DelayCorrection::predict; }
  bool local_stepping() const {
    return delayed() && opt.delay_correction == DelayCorrection::local;
  }
  bool correcting() const { return predicting() || local_stepping(); }
  // The tensors the inner optimizer steps.
  std::vector<torch::Tensor>& stepped_params() { return delayed() ? master : params; }
  // --- optimizer_delayed.cpp ---
  // Switches the inner optimizer to master copies of the parameters (moving any state it holds).
  void init_master();
  // Copies master (or its prediction, see OptimizerOptions::delay_correction) into the
  // parameters (delayed mode; no-op otherwise), or the parameters into master.
  void publish_master();
  void reload_master();
  // DelayCorrection::local: puts master stepped by `own` (this peer's contribution, flat) into
  // the parameters; master and the inner optimizer's state are left as they were.
  void local_step(const torch::Tensor& own);
  // Puts master itself into the parameters if they hold a prediction (before the peer stops).
  void settle_master();
  // Puts the collaboration's parameters at `epoch` into the model while they hold a prediction
  // and returns what they held (empty if nothing changed); master_mu held or no round in
  // flight. restore_params() puts the returned tensors back.
  std::vector<torch::Tensor> hold_exact_params();
  void restore_params(const std::vector<torch::Tensor>& saved);
  // Starts the round of this epoch and its step in the background (the accumulators restart
  // at zero for the next epoch).
  void start_background_round(StepReport& rep, const training::CollaborationView& v);
  // Applies the background round's outcome if it has finished (or waits for it with `block`).
  // Returns whether a round was finished.
  bool finish_background_round(StepReport& rep, bool block);
  void run_background_round(BackgroundRound& b);
  bool background_step_applied() const;  // master_mu held
  // OptimizerOptions::delay_max_backlog: whether this peer's samples since the round in flight
  // began reached the bound; waits for that round, serving state requests meanwhile.
  bool backlog_full() const;
  void wait_background_round();

  training::ProgressConfig progress_config() const {
    training::ProgressConfig c = opt.progress;
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
  std::uint64_t compute_digest();

  Duration step_time_at_epoch{0};  // stats.step_time when the last synchronous step ended
  static std::vector<net::PeerId> member_ids(const training::RoundResult& r) {
    std::vector<net::PeerId> ids;
    for (const auto& m : r.members) ids.push_back(m.peer);
    return ids;
  }

  // Runs `f(tracker)` where the tracker lives: the io thread, or here when alone.
  template <class F>
  auto with_tracker(F&& f) {
    if (io) return io->run([&](training::ProgressTracker& t) { return f(t); });
    return f(*local_tracker);
  }

  NamedTensors extra_tensors();

  void accumulate(std::size_t batch_size);

  // Puts `grads` (flat float32, the gradient to apply) into .grad and steps the inner optimizer.
  void apply_inner_step(const torch::Tensor& grads_flat);
  void load_grads(const torch::Tensor& grads_flat);  // into stepped_params()'s .grad

  // The local epoch becomes `new_epoch` (stepped, or state downloaded); `round`: the round
  // whose step got it there (its members are at the new epoch too).
  void finish_epoch(std::uint64_t new_epoch, const training::RoundResult* round = nullptr);

  // The local epoch is now `new_epoch` (the tracker already knows).
  void enter_epoch(std::uint64_t new_epoch);

  // The flat tensor this peer contributes to a round: mean gradient (DeDLOC) or
  // pseudo-gradient (DiLoCo).
  torch::Tensor contribution();
  // The last contribution() was applied (a round's result, or this peer's own step alone).
  void commit_contribution();

  // Applies the collaboration's (or this peer's own) averaged contribution.
  void apply(const torch::Tensor& averaged);

  // The key of this epoch's averaging round: peers at other epochs never join it.
  std::string round_key() const;

  void step_alone(StepReport& rep);

  // The peers this epoch's round expects, from the view of the decision that began it: a
  // majority of those at the epoch or one behind must be in the group (peers at the epoch only
  // would let two pairs, each seeing the other one behind through lagging records, both step
  // and fork; every live peer would wait for peers far behind, who must download first); if
  // every live peer is at the epoch (or far behind), the round may begin as soon as all of
  // them are.
  void expect_members(training::RoundOptions& ro, const training::CollaborationView& v) const;

  // This epoch's round: this peer's flat contribution goes to the collaboration as it is, and
  // the group's average comes back in `result` (one flat tensor, written in place by the
  // averager: no copies between the optimizer and the all-reduce).
  struct Round {
    training::RoundData data;
    training::RoundOptions options;
    torch::Tensor result;
  };

  // The round over `mine` (contiguous float32), with the peers `v` (the decision's view, at
  // this epoch) expects.
  Round make_round(torch::Tensor mine, const training::CollaborationView& v);

  // Names and sizes of the parameters, in order (what a round averages).
  training::Layout layout() const;

  // Early matchmaking: the collaboration expects the target in view.eta; the collaboration
  // may form this epoch's group now (average() later brings the data).
  void prepare_round(const training::CollaborationView& v);

  // Runs a round on the io thread (blocking this thread, bounded); a group of one is a failure.
  // `serve`: the calling (training) thread serves state requests while it waits.
  result<training::RoundResult> run_round(const Round& round, bool serve = false);

  void note_round(StepReport& rep, const training::RoundResult& r);

  // A round failed: retry after a pause; after opt.max_failed_rounds, if no other live peer is at
  // this epoch and a fetch begun after the failure's hold confirmed it (a failed round
  // disturbs the view: ProgressTracker::round_failed), step with the own gradients.
  void round_failed(StepReport& rep, const Error& e);

  // The gradient check of the round's drawn members (OptimizerOptions::check_contribution).
  void check_contributions(const training::RoundResult& r);
  void average_and_step(StepReport& rep, const training::CollaborationView& v);

  // Downloads the collaboration's state: it is ahead, or (want_digest != 0) it is at this
  // epoch with other parameters than this peer's (a fork), and holds want_digest.
  void download(StepReport& rep, std::uint64_t want_digest = 0);

  result<std::filesystem::path> save(std::uint64_t pass, std::uint64_t position);

  // Training thread: serialises the state for a peer that asked (at every step() call, and
  // every 20 ms while a synchronous round is in flight, so a peer behind is never held up by
  // this one's round). With a background round in flight the parameters and the optimizer
  // state are those of `epoch` until its step is applied (under master_mu): served under that
  // lock; once applied, at the next call after it was published.
  void serve_pending_state_request();
};

}  // namespace starling::optim
