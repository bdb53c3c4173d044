// starling::Optimizer: the training-thread side (accumulation, steps, state) and the glue to
// the io-thread side (optimizer_io.hpp: progress loop, rounds, state serving).
#include "starling/optim/optimizer.hpp"

#include "optimizer_impl.hpp"
#include "state_format_torch.hpp"

namespace starling::optim {

Optimizer::Optimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

void Optimizer::serve_state_requests() {
  impl_->serve_pending_state_request();
}

Optimizer::~Optimizer() {
  if (impl_ && !impl_->shut_down) (void)shutdown(5s);
}

result<std::unique_ptr<Optimizer>> Optimizer::create(
    torch::nn::Module& model, std::unique_ptr<torch::optim::Optimizer> inner,
    OptimizerOptions options, std::shared_ptr<training::Collaboration> collaboration) {
  ST_TRY(validate(options));
  if (!inner) return make_error(errc::invalid_argument, "optimizer: no inner optimizer");
  // Peers exchange, and checkpoints keep, the optimizer's state in the state format: an
  // optimizer it cannot carry (LBFGS, a user's own) would fail at the first state transfer.
  if (auto kind = state_torch::kind_of(*inner); !kind && !options.optimizer_state_in_model)
    return make_error(errc::unsupported, "optimizer: " + kind.error().message());
  auto impl = std::make_unique<Impl>(model, std::move(inner), std::move(options));
  for (const auto& item : model.named_parameters(true)) {
    impl->names.push_back(item.key());
    impl->params.push_back(item.value());
  }
  // The inner optimizer must hold exactly the model's parameters.
  std::size_t held = 0;
  for (const auto& g : impl->inner->param_groups()) {
    for (const auto& p : g.params()) {
      bool found = false;
      for (const auto& q : impl->params)
        found = found || p.unsafeGetTensorImpl() == q.unsafeGetTensorImpl();
      if (!found)
        return make_error(
            errc::invalid_argument,
            "optimizer: the inner optimizer holds a tensor that is not a model parameter");
      ++held;
    }
  }
  if (held != impl->params.size())
    return make_error(
        errc::invalid_argument,
        fmt::format("optimizer: the inner optimizer holds {} tensors, the model has {} parameters",
                    held, impl->params.size()));
  for (const auto& p : impl->params) impl->numel += p.numel();
  impl->acc_flat = torch::zeros({impl->numel}, torch::kFloat32);
  std::int64_t off = 0;
  for (const auto& p : impl->params) {
    impl->acc.push_back(impl->acc_flat.narrow(0, off, p.numel()).view(p.sizes()));
    off += p.numel();
  }
  if (impl->opt.diloco_steps > 0) impl->diloco.reset(impl->params);

  if (!impl->opt.checkpoint_dir.empty()) {
    ST_TRY(auto dir,
           training::CheckpointDir::open(impl->opt.checkpoint_dir, impl->opt.checkpoints_kept));
    impl->ckpt = std::move(dir);
    NamedTensors extra = impl->extra_tensors();
    ST_TRY(auto meta, load_latest_checkpoint(*impl->ckpt, model, impl->state_optimizer(), &extra));
    if (meta) {
      if (meta->run_id != impl->opt.run_id)
        Impl::log()->warn("checkpoint is from run '{}', this is run '{}'", meta->run_id,
                          impl->opt.run_id);
      impl->epoch = meta->epoch;
      impl->diloco.set_outer_steps(meta->outer_steps);
      if (impl->opt.diloco_steps > 0) {
        torch::NoGradGuard no_grad;
        for (std::size_t i = 0; i < impl->params.size(); ++i)
          impl->params[i].detach().copy_(impl->diloco.anchors()[i]);
      }
      impl->resumed = meta;
    }
  }

  const auto samples_total = impl->resumed ? impl->resumed->samples_total : 0;
  impl->digest = impl->compute_digest();
  if (collaboration) {
    // Networked: never step alone before having looked for the others (peers started
    // together would each step alone and fork), nor on records older than the last step.
    auto cfg = impl->progress_config();
    cfg.confirm_alone = true;
    cfg.startup_grace = impl->opt.matchmaking_time;
    training::ProgressTracker tracker(collaboration->self(), cfg);
    tracker.restore(impl->epoch, 0, samples_total);
    tracker.set_digest(impl->digest);
    tracker.start(Clock::now());
    impl->io = OptimizerIo::start(std::move(collaboration), std::move(tracker), impl->opt);
    // (An auxiliary peer serves no state: OptimizerIo::start skips it.)
    if (impl->opt.delay_optimizer_step) impl->init_master();
  } else {
    auto self = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
    impl->local_tracker =
        std::make_unique<training::ProgressTracker>(self, impl->progress_config());
    impl->local_tracker->restore(impl->epoch, 0, samples_total);
    impl->local_tracker->set_digest(impl->digest);
  }
  return std::unique_ptr<Optimizer>(new Optimizer(std::move(impl)));
}

result<StepReport> Optimizer::step(std::size_t batch_size) {
  auto& m = *impl_;
  if (m.shut_down) return make_error(errc::closed, "optimizer: step() after shutdown()");
  if (m.opt.auxiliary)
    return make_error(errc::invalid_argument, "optimizer: auxiliary peers do not call step()");
  if (batch_size == 0) batch_size = m.opt.batch_size;
  if (batch_size == 0)
    return make_error(errc::invalid_argument, "optimizer: step() needs a batch size");
  const TimePoint now = Clock::now();
  const Duration compute = m.last_step_end ? now - *m.last_step_end : Duration::zero();

  m.serve_pending_state_request();
  if (m.opt.diloco_steps > 0) {
    m.inner->step();  // local update with this batch's gradients
    m.inner->zero_grad();
  } else {
    m.accumulate(batch_size);
  }
  m.local_samples += batch_size;
  StepReport rep;
  // A finished background step is applied now; one still running is never waited for: the
  // gradients computed meanwhile keep accumulating and the next round carries them all
  // (weighted by their samples). Only one round is ever in flight, so no gradient is more than
  // one step stale.
  // With delay_max_backlog, a round that outlasts that much computing is waited for.
  if (m.backlog_full()) m.wait_background_round();
  const bool applied = m.bg && m.finish_background_round(rep, false) && rep.stepped;
  auto decision = m.with_tracker([&](training::ProgressTracker& t) {
    t.report_samples(batch_size, compute);
    // One epoch per call: after applying a step, the caller sees the new epoch (and may stop
    // at a last epoch) before anything else starts.
    training::Decision d;
    if (applied)
      d.view = t.view(Clock::now());
    else
      d = t.decide(Clock::now());
    m.note_tracker(t, d.view);
    return d;
  });

  // The group prepared for this epoch's round formed and another member sent its data (it
  // counted the target reached): this peer's data ends the group's wait now, rather than
  // when its own view of the others' progress (records that lag) says so.
  if (decision.action == training::Action::accumulate && !applied && m.io && !m.bg &&
      m.local_samples > 0 && now >= m.round_retry_after && m.io->peers_supplied(m.round_key())) {
    decision.action = training::Action::average_and_step;
    ++m.stats.rounds_joined_early;
  }
  rep.action = decision.action;
  switch (decision.action) {
    case training::Action::accumulate:
      break;
    case training::Action::begin_matchmaking:
      m.prepare_round(decision.view);
      break;
    case training::Action::step_alone:
      m.step_alone(rep);
      break;
    case training::Action::average_and_step:
      if (m.io && m.delayed())
        m.start_background_round(rep, decision.view);
      else if (m.io)
        m.average_and_step(rep, decision.view);
      else
        m.step_alone(rep);
      break;
    case training::Action::download_state:
      if (m.io) m.download(rep, decision.want_digest);
      break;
  }
  rep.epoch = m.epoch;
  rep.round_in_background = m.bg != nullptr;
  m.stats.bytes_sent += rep.bytes_sent;
  m.stats.bytes_received += rep.bytes_received;
  m.last_step_end = Clock::now();
  m.stats.step_time += *m.last_step_end - now;
  return rep;
}

result<StepReport> Optimizer::assist() {
  auto& m = *impl_;
  if (m.shut_down) return make_error(errc::closed, "optimizer: assist() after shutdown()");
  if (!m.opt.auxiliary)
    return make_error(errc::invalid_argument, "optimizer: assist() is for auxiliary peers");
  if (!m.io) return make_error(errc::unavailable, "optimizer: an auxiliary peer needs peers");
  StepReport rep;
  auto decision = m.with_tracker([&](training::ProgressTracker& t) {
    auto d = t.decide(Clock::now());  // follows the collaboration's epoch
    m.note_tracker(t, d.view);
    m.epoch = t.local_epoch();
    return d;
  });
  rep.action = decision.action;
  if (decision.action == training::Action::begin_matchmaking) m.prepare_round(decision.view);
  if (decision.action == training::Action::average_and_step &&
      Clock::now() >= m.round_retry_after) {
    // Zeros with weight 0: the group's average is unchanged; this peer's parameters are not
    // the collaboration's (it never downloads them), so the result is not applied.
    auto r = m.run_round(m.make_round(torch::zeros_like(m.acc_flat), decision.view));
    if (r) {
      m.note_round(rep, r.value());
      m.finish_epoch(m.epoch + 1, &r.value());
      rep.stepped = true;
    } else {
      rep.round_error = r.error();
      ++m.stats.rounds_failed;
      m.round_retry_after = Clock::now() + m.opt.retry_backoff;
    }
  }
  rep.epoch = m.epoch;
  m.stats.bytes_sent += rep.bytes_sent;
  m.stats.bytes_received += rep.bytes_received;
  return rep;
}

void Optimizer::zero_grad() {
  for (auto& p : impl_->params)
    if (p.mutable_grad().defined()) p.mutable_grad().zero_();
}

std::uint64_t Optimizer::epoch_samples() const {
  return impl_->local_samples;
}

std::uint64_t Optimizer::local_epoch() const {
  return impl_->epoch;
}

OptimizerStatus Optimizer::status() const {
  auto& m = *impl_;
  // step() refreshes the tracker's half of the status on its way through the io thread, so a
  // training loop that calls status() after every step() never waits for the io thread. A step
  // that moved the epoch (after that refresh) makes it stale at once.
  if (!m.io || Clock::now() - m.tracker_status_at > Impl::kStatusFresh ||
      m.tracker_status.local_epoch != m.epoch)
    m.with_tracker([&](training::ProgressTracker& t) {
      m.note_tracker(t, t.view(Clock::now()));
      return 0;
    });
  OptimizerStatus s = m.stats;
  s.local_epoch = m.tracker_status.local_epoch;
  s.local_samples = m.tracker_status.local_samples;
  s.samples_total = m.tracker_status.samples_total;
  s.local_samples_per_second = m.tracker_status.local_samples_per_second;
  s.collaboration = m.tracker_status.collaboration;
  return s;
}

torch::optim::Optimizer& Optimizer::inner() {
  return *impl_->inner;
}
const OptimizerOptions& Optimizer::options() const {
  return impl_->opt;
}
const std::optional<training::CheckpointMeta>& Optimizer::resumed_from() const {
  return impl_->resumed;
}

result<void> Optimizer::load_state_from_peers() {
  if (!impl_->io) return make_error(errc::unavailable, "optimizer: training alone, no peers");
  StepReport rep;
  if (impl_->bg) impl_->finish_background_round(rep, true);  // it owns the optimizer state
  impl_->download_retry_after = {};
  impl_->download(rep);
  if (rep.round_error) return *rep.round_error;
  return success();
}

void Optimizer::finish_round() {
  if (impl_->bg) {
    StepReport ignored;
    impl_->finish_background_round(ignored, true);
  }
  impl_->settle_master();
}

void Optimizer::with_collaboration_parameters(const std::function<void()>& f) {
  auto& m = *impl_;
  std::vector<torch::Tensor> held;
  {
    std::unique_lock<std::mutex> lk;
    if (m.bg) lk = std::unique_lock(m.master_mu);  // a step may be applied meanwhile
    held = m.hold_exact_params();
  }
  try {
    f();
  } catch (...) {
    m.restore_params(held);
    throw;
  }
  m.restore_params(held);
}

std::uint64_t Optimizer::state_digest() const {
  return impl_->digest;
}

result<std::filesystem::path> Optimizer::save_checkpoint(std::uint64_t stream_pass,
                                                         std::uint64_t stream_position) {
  return impl_->save(stream_pass, stream_position);
}

result<void> Optimizer::shutdown(Duration timeout) {
  auto& m = *impl_;
  if (m.shut_down) return success();
  m.shut_down = true;
  result<void> out = success();
  if (m.io) out = m.io->stop(timeout);  // cancels a round in flight
  if (m.bg) {
    // Its round ends with the io side; a step it finished is applied (the final checkpoint and
    // the parameters then agree), a failed one gives its gradients back.
    StepReport ignored;
    m.failed_rounds = 0;
    m.finish_background_round(ignored, true);
  }
  m.settle_master();  // the model ends at the collaboration's parameters
  if (m.ckpt) {
    auto r = m.save(0, 0);
    if (!r) {
      Impl::log()->warn("final checkpoint failed: {}", r.error().message());
      if (out) out = r.error();
    }
  }
  return out;
}

}  // namespace starling::optim
