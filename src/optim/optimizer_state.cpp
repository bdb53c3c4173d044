// starling::Optimizer's state (training thread): gradient accumulation, the inner step, epoch
// changes, digests, state download and serving, checkpoints. See optimizer_impl.hpp.
#include "optimizer_impl.hpp"

namespace starling::optim {

std::uint64_t Optimizer::Impl::compute_digest() {
  torch::NoGradGuard no_grad;
  training::StateDigest d;
  // Delayed updates: master, the collaboration's parameters (the model may hold a prediction).
  for (const auto& p : stepped_params()) {
    auto t = p.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    d.update(t.data_ptr<float>(), static_cast<std::size_t>(t.numel()) * sizeof(float));
  }
  return d.value();
}

NamedTensors Optimizer::Impl::extra_tensors() {
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

void Optimizer::Impl::accumulate(std::size_t batch_size) {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto& g = params[i].mutable_grad();
    if (!g.defined()) continue;
    acc[i].add_(g.detach().to(torch::kCPU, torch::kFloat32).view_as(acc[i]),
                static_cast<double>(batch_size));
    g.zero_();
  }
}

void Optimizer::Impl::load_grads(const torch::Tensor& grads_flat) {
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

void Optimizer::Impl::apply_inner_step(const torch::Tensor& grads_flat) {
  load_grads(grads_flat);
  if (correcting()) {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < master.size(); ++i) prev_master[i].copy_(master[i]);
  }
  inner->step();
  for (auto& p : stepped_params())
    if (p.mutable_grad().defined()) p.mutable_grad().zero_();
}

void Optimizer::Impl::finish_epoch(std::uint64_t new_epoch, const training::RoundResult* round) {
  acc_flat.zero_();
  local_samples = 0;
  digest = compute_digest();
  std::vector<net::PeerId> members;
  if (round) members = member_ids(*round);
  with_tracker([&](training::ProgressTracker& t) {
    t.set_epoch(new_epoch);
    t.set_digest(digest);
    if (!members.empty()) t.round_succeeded(members, Clock::now());
    return 0;
  });
  enter_epoch(new_epoch);
}

void Optimizer::Impl::enter_epoch(std::uint64_t new_epoch) {
  epoch = new_epoch;
  // Failures count per epoch: a new epoch (stepped or downloaded) starts clean, and so does its
  // round. (A peer whose round failed because the others had moved on downloads their state
  // at once; holding its next round back for the old round's backoff made it miss that round
  // too, and drop the samples it computed meanwhile at the next download, round after round.)
  failed_rounds = 0;
  round_retry_after = {};
  if (io) io->state_changed(epoch);
  if (ckpt && opt.checkpoint_every > 0 && epoch % opt.checkpoint_every == 0) {
    auto r = save(0, 0);
    if (!r) log()->warn("checkpoint at epoch {} failed: {}", epoch, r.error().message());
  }
}

void Optimizer::Impl::download(StepReport& rep, std::uint64_t want_digest) {
  if (Clock::now() < download_retry_after) return;
  if (want_digest != 0)
    log()->info("epoch {}: parameters forked (digest {:016x}, most peers {:016x}): downloading",
                epoch, digest, want_digest);
  auto r = io->download_state(opt.load_state_timeout, opt.load_state_timeout + opt.io_grace,
                              want_digest);
  if (r && (r.value().epoch < epoch ||
            (r.value().epoch == epoch && r.value().digest != 0 && r.value().digest == digest)))
    r = make_error(
        errc::unavailable,
        fmt::format("the donors' state (epoch {}) is not newer than this peer's", r.value().epoch));
  if (r) {
    NamedTensors extra = extra_tensors();
    auto ok = load_training_state(r.value().bytes, model, state_optimizer(), &extra);
    if (ok) {
      ++stats.state_downloads;
      stats.samples_dropped += local_samples;
      const auto dropped = local_samples;
      reload_master();
      if (opt.diloco_steps > 0) {
        // The collaboration's state is the anchors: continue from them.
        torch::NoGradGuard no_grad;
        for (std::size_t i = 0; i < params.size(); ++i)
          params[i].detach().copy_(diloco.anchors()[i]);
      }
      log()->info("loaded state of epoch {} from peers ({} bytes; {} samples of epoch {} dropped)",
                  r.value().epoch, r.value().bytes.size(), dropped, epoch);
      finish_epoch(r.value().epoch);
      // Behind a running collaboration: its peers are in the view. (A download decided by the
      // digest vote may come from a partial view at startup: it settles nothing.)
      if (want_digest == 0)
        with_tracker([](training::ProgressTracker& t) {
          t.state_downloaded();
          return 0;
        });
      rep.epoch = epoch;
      return;
    }
    r = ok.error();
  }
  rep.round_error = r.error();
  download_retry_after = Clock::now() + opt.retry_backoff;
  log()->warn("epoch {}: state download failed: {}", epoch, r.error().message());
}

result<std::filesystem::path> Optimizer::Impl::save(std::uint64_t pass, std::uint64_t position) {
  if (!ckpt) return make_error(errc::invalid_argument, "no checkpoint directory configured");
  if (bg) {
    // The background step owns the optimizer state: apply it first.
    StepReport ignored;
    finish_background_round(ignored, true);
  }
  training::CheckpointMeta m;
  m.run_id = opt.run_id;
  m.epoch = epoch;
  m.samples_accumulated = local_samples;
  m.samples_total = with_tracker([](training::ProgressTracker& t) { return t.samples_total(); });
  m.stream_pass = pass;
  m.stream_position = position;
  m.outer_steps = diloco.outer_steps();
  const auto held = hold_exact_params();
  auto out = optim::save_checkpoint(*ckpt, m, model, state_optimizer(), extra_tensors());
  restore_params(held);
  return out;
}

void Optimizer::Impl::serve_pending_state_request() {
  if (!io || !io->state_requested()) return;
  std::unique_lock<std::mutex> lk;
  if (bg) {
    lk = std::unique_lock(master_mu);
    if (background_step_applied()) return;
  }
  const auto held = hold_exact_params();
  auto bytes = save_training_state(model, state_optimizer(), extra_tensors());
  restore_params(held);
  if (!bytes) {
    log()->warn("cannot serialise state for a peer: {}", bytes.error().message());
    return;
  }
  io->offer_state(epoch, digest, std::move(bytes).value());
}
}  // namespace starling::optim
