// Delayed parameter updates (OptimizerOptions::delay_optimizer_step): the averaging round of
// an epoch and the optimizer step run on a background thread while the training thread
// computes the next epoch's gradients on the current (one step stale) parameters; the step is
// applied at the next step() call after it finished.
//
// Every peer still ends each epoch with bit-identical parameters: the inner optimizer steps
// `master` (the parameters as of the last applied step, identical on every peer) with the
// round's averaged gradient, exactly as the synchronous path would; only the moment the
// result is copied into the model's parameters changes. At most one round is in flight, so
// the gradients of epoch e+1 are computed on the parameters of epoch e at worst (staleness
// of one step). The training thread never waits for the round in flight: when the round takes
// longer than the collaboration needs to reach the next target, the gradients keep
// accumulating and the next round (started by the first step() after this one was applied)
// carries all of them, weighted by their samples like any round. A failed background round
// gives its gradients and samples back to the accumulators and is retried like a failed
// synchronous round.
//
// OptimizerOptions::delay_correction moves where the training thread computes gradients while
// a round is in flight (master stays what every peer holds): to master extrapolated by its
// last step (`predict`, set when a step is published), or to master after a local step with
// this peer's own contribution (`local`, set when the round starts; the published step of the
// collaboration's average then replaces it).
#include "optimizer_impl.hpp"
#include "state_format_torch.hpp"

namespace starling::optim {

struct Optimizer::Impl::BackgroundRound {
  std::future<void> finished;  // of its job on bg_worker
  std::atomic<bool> done{false};
  std::uint64_t epoch = 0;  // the epoch the round averages
  torch::Tensor acc;        // the accumulators (sums) it took, given back on failure
  std::uint64_t samples = 0;
  Round round;  // the contribution and where the average comes
  // Written by the background thread before `done`.
  result<training::RoundResult> outcome =
      make_error(errc::internal, "background round did not run");
  Duration averaging_time{0};
  bool applied = false;  // the step changed master and the optimizer state (master_mu)
};

bool Optimizer::Impl::background_step_applied() const {
  return bg && bg->applied;
}

bool Optimizer::Impl::backlog_full() const {
  if (!bg || opt.delay_max_backlog <= 0) return false;
  const auto& v = tracker_status.collaboration;
  const std::size_t computing = v.num_peers > v.num_auxiliary ? v.num_peers - v.num_auxiliary : 1;
  return static_cast<double>(local_samples) * static_cast<double>(computing) >=
         opt.delay_max_backlog * static_cast<double>(opt.target_batch_size);
}

void Optimizer::Impl::wait_background_round() {
  // Bounded: the round ends by its own deadline (averaging_timeout) or with the io side.
  while (bg && !bg->done) {
    serve_pending_state_request();
    bg->finished.wait_for(std::chrono::milliseconds(20));
  }
}

Optimizer::Impl::~Impl() {
  if (bg && bg->finished.valid()) bg->finished.wait();
}

void Optimizer::Impl::init_master() {
  torch::NoGradGuard no_grad;
  bg_worker = std::make_unique<ThreadPool>(1);
  auto& state = inner->state();
  for (const auto& p : params) {
    auto m = p.detach().clone();
    m.set_requires_grad(true);
    // torch keys per-parameter optimizer state by the tensor's address.
    auto it = state.find(c10::guts::to_string(p.unsafeGetTensorImpl()));
    if (it != state.end()) {
      auto st = std::move(it->second);
      state.erase(it);
      state[c10::guts::to_string(m.unsafeGetTensorImpl())] = std::move(st);
    }
    for (auto& g : inner->param_groups())
      for (auto& q : g.params())
        if (q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) q = m;
    master.push_back(std::move(m));
  }
  if (correcting())
    for (const auto& m : master) prev_master.push_back(m.detach().clone());
}

void Optimizer::Impl::publish_master() {
  if (!delayed()) return;
  torch::NoGradGuard no_grad;
  std::lock_guard lk(master_mu);
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto p = params[i].detach();
    if (predicting()) {
      // master + (master - prev_master): where the next step is expected to leave master.
      p.copy_(master[i]);
      p.mul_(2).sub_(prev_master[i]);
    } else {
      p.copy_(master[i]);
    }
  }
  predicted = predicting();
}

void Optimizer::Impl::reload_master() {
  if (!delayed()) return;
  torch::NoGradGuard no_grad;
  std::lock_guard lk(master_mu);
  for (std::size_t i = 0; i < params.size(); ++i) {
    master[i].detach().copy_(params[i]);
    // No step known since the download: no extrapolation until the next one.
    if (correcting()) prev_master[i].copy_(params[i]);
  }
  predicted = false;
}

void Optimizer::Impl::local_step(const torch::Tensor& own) {
  // No round in flight: this thread owns master and the inner optimizer. The inner optimizer
  // steps master in place and updates its state: the step runs on a deep copy of the state and
  // master is put back after it.
  const auto kind = state_torch::kind_of(*inner).value();  // create() checked it
  auto& state = inner->state();
  std::remove_reference_t<decltype(state)> kept_state;
  kept_state.swap(state);
  std::vector<torch::Tensor> kept;
  torch::NoGradGuard no_grad;
  for (const auto& m : master) kept.push_back(m.detach().clone());
  auto put_back = [&] {
    for (std::size_t i = 0; i < master.size(); ++i) {
      master[i].detach().copy_(kept[i]);
      if (master[i].mutable_grad().defined()) master[i].mutable_grad().zero_();
    }
    state.swap(kept_state);
  };
  try {
    for (const auto& [key, st] : kept_state) {
      auto slots = state_torch::slots_of(kind, *st);
      for (auto& t : slots)
        if (t.defined()) t = t.clone();
      state[key] = state_torch::make_param_state(kind, state_torch::step_of(kind, *st), slots);
    }
    load_grads(own);
    inner->step();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].detach().copy_(master[i]);
  } catch (...) {
    put_back();
    throw;
  }
  put_back();
  predicted = true;
}

void Optimizer::Impl::settle_master() {
  if (!predicted) return;
  torch::NoGradGuard no_grad;
  std::lock_guard lk(master_mu);
  for (std::size_t i = 0; i < params.size(); ++i) params[i].detach().copy_(master[i]);
  predicted = false;
}

std::vector<torch::Tensor> Optimizer::Impl::hold_exact_params() {
  std::vector<torch::Tensor> saved;
  if (!predicted) return saved;
  torch::NoGradGuard no_grad;
  // A step applied in the background (not yet published) moved master past `epoch`; the
  // parameters of `epoch` are then those it started from.
  const auto& exact = bg && bg->applied ? prev_master : master;
  for (std::size_t i = 0; i < params.size(); ++i) {
    saved.push_back(params[i].detach().clone());
    params[i].detach().copy_(exact[i]);
  }
  return saved;
}

void Optimizer::Impl::restore_params(const std::vector<torch::Tensor>& saved) {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < saved.size(); ++i) params[i].detach().copy_(saved[i]);
}

void Optimizer::Impl::run_background_round(BackgroundRound& b) {
  const auto t0 = Clock::now();
  try {
    b.outcome = run_round(b.round);
    b.averaging_time = Clock::now() - t0;
    if (b.outcome) {
      std::lock_guard lk(master_mu);
      apply(b.round.result);
      b.applied = true;
    }
  } catch (const std::exception& e) {
    b.outcome = make_error(errc::internal, fmt::format("background step: {}", e.what()));
  }
  b.done = true;
}

void Optimizer::Impl::start_background_round(StepReport& rep,
                                             const training::CollaborationView& v) {
  if (Clock::now() < round_retry_after) return;
  auto b = std::make_shared<BackgroundRound>();
  b->epoch = epoch;
  b->samples = local_samples;
  b->acc = acc_flat.clone();
  auto own = contribution().contiguous();
  b->round = make_round(own, v);
  if (local_stepping()) local_step(own);
  acc_flat.zero_();
  local_samples = 0;
  with_tracker([](training::ProgressTracker& t) { t.begin_background_round(); });
  b->finished = bg_worker->submit([this, raw = b.get()] { run_background_round(*raw); });
  bg = std::move(b);
  rep.round_in_background = true;
}

bool Optimizer::Impl::finish_background_round(StepReport& rep, bool block) {
  if (!bg || (!block && !bg->done)) return false;
  bg->finished.wait();
  auto b = std::move(bg);
  bg.reset();
  rep.averaging_time += b->averaging_time;
  if (!b->outcome) {
    // Like a failed synchronous round: the gradients and samples go back to this epoch.
    acc_flat.add_(b->acc);
    local_samples += b->samples;
    with_tracker([](training::ProgressTracker& t) { t.end_background_round(false); });
    round_failed(rep, b->outcome.error());
    return true;
  }
  note_round(rep, b->outcome.value());
  commit_contribution();
  publish_master();
  rep.stepped = true;
  digest = compute_digest();
  const auto members = member_ids(b->outcome.value());
  with_tracker([&](training::ProgressTracker& t) {
    t.end_background_round(true);
    t.set_digest(digest);
    t.round_succeeded(members, Clock::now());
    return 0;
  });
  enter_epoch(b->epoch + 1);
  return true;
}

}  // namespace starling::optim
