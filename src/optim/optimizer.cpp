// starling::Optimizer: the training-thread side (accumulation, steps, state) and the glue to
// the io-thread side (optimizer_io.hpp: progress loop, rounds, state serving).
#include "starling/optim/optimizer.hpp"

#include <torch/utils.h>

#include <fmt/format.h>

#include "optimizer_io.hpp"
#include "starling/core/log.hpp"
#include "starling/optim/diloco.hpp"
#include "starling/optim/training_state.hpp"

namespace starling::optim {
namespace {

auto log() {
  return logger("optim");
}

// How long the training thread waits for an io-thread job beyond the job's own deadline
// before giving up on it (the io thread is stopped or wedged).
constexpr Duration kIoGrace = 30s;
// After a failed round or download, wait this long before trying again.
constexpr Duration kRetryBackoff = 2s;
// Consecutive failed rounds after which the peer steps with its own gradients.
constexpr int kMaxFailedRounds = 3;

}  // namespace

struct Optimizer::Impl {
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
  std::uint64_t local_samples = 0;  // toward `epoch`
  std::optional<TimePoint> last_step_end;
  TimePoint retry_after{};
  int failed_rounds = 0;
  bool shut_down = false;
  OptimizerStatus stats;

  Impl(torch::nn::Module& m, std::unique_ptr<torch::optim::Optimizer> in, OptimizerOptions o)
      : model(m), inner(std::move(in)), opt(std::move(o)) {}

  ProgressConfig progress_config() const {
    ProgressConfig c = opt.progress;
    c.target_batch_size = opt.target_batch_size;
    c.per_peer_target = opt.diloco_steps > 0 ? std::uint64_t{opt.diloco_steps} * opt.batch_size : 0;
    c.matchmaking_time = opt.matchmaking_time;
    c.auxiliary = opt.auxiliary;
    c.client_mode = opt.client_mode;
    if (opt.delay_optimizer_step) c.epoch_tolerance = std::max<std::uint64_t>(c.epoch_tolerance, 1);
    return c;
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
      for (auto& p : params) {
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
    for (auto& p : params)
      if (p.mutable_grad().defined()) p.mutable_grad().zero_();
  }

  void finish_epoch(std::uint64_t new_epoch) {
    acc_flat.zero_();
    local_samples = 0;
    epoch = new_epoch;
    failed_rounds =
        0;  // failures count per epoch: a new epoch (stepped or downloaded) starts clean
    with_tracker([&](ProgressTracker& t) { t.set_epoch(new_epoch); });
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
    rep.stepped = true;
    finish_epoch(epoch + 1);
  }

  void average_and_step(StepReport& rep, std::size_t expected_members) {
    if (Clock::now() < retry_after) return;
    torch::Tensor mine = contribution().contiguous();
    auto buf = std::make_shared<RoundBuffer>();
    buf->owner = std::make_shared<torch::Tensor>(mine);
    buf->data = mine.data_ptr<float>();
    buf->size = static_cast<std::size_t>(mine.numel());
    buf->names = names;
    for (auto& p : params) buf->sizes.push_back(p.numel());
    RoundOptions ro;
    ro.key = round_key();
    ro.weight = static_cast<double>(local_samples);
    ro.deadline = Clock::now() + opt.averaging_timeout;
    ro.compression = opt.grad_compression;
    ro.expected_members = expected_members;
    auto t0 = Clock::now();
    auto r = io->average(buf, ro, opt.averaging_timeout + kIoGrace);
    rep.averaging_time = Clock::now() - t0;
    // A group of one means the others were not there (they stepped already, or are behind):
    // applying our own gradients alone would fork the parameters at this epoch.
    if (r && r.value().members.size() < 2)
      r = make_error(errc::unavailable, fmt::format("round {}: no other peer joined", ro.key));
    if (!r) {
      rep.round_error = r.error();
      ++stats.rounds_failed;
      retry_after = Clock::now() + kRetryBackoff;
      if (++failed_rounds >= kMaxFailedRounds) {
        log()->warn("epoch {}: {} averaging rounds failed (last: {}); stepping with local data",
                    epoch, failed_rounds, r.error().message());
        step_alone(rep);
      } else {
        log()->info("epoch {}: averaging failed: {}", epoch, r.error().message());
      }
      return;
    }
    ++stats.rounds_ok;
    rep.group_size = r.value().members.size();
    rep.group_samples = r.value().total_weight;
    rep.bytes_sent = r.value().bytes_sent;
    rep.bytes_received = r.value().bytes_received;
    apply(mine);  // averaged in place
    rep.stepped = true;
    finish_epoch(epoch + 1);
  }

  void download(StepReport& rep) {
    if (Clock::now() < retry_after) return;
    auto r = io->download_state(opt.load_state_timeout, opt.load_state_timeout + kIoGrace);
    if (r) {
      NamedTensors extra = extra_tensors();
      auto ok = load_training_state(r.value().bytes, model, inner.get(), &extra);
      if (ok) {
        ++stats.state_downloads;
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
    retry_after = Clock::now() + kRetryBackoff;
    log()->warn("epoch {}: state download failed: {}", epoch, r.error().message());
  }

  result<std::filesystem::path> save(std::uint64_t pass, std::uint64_t position) {
    if (!ckpt) return make_error(errc::invalid_argument, "no checkpoint directory configured");
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

  // Serialises the current state for a peer that downloads it (on the training thread).
  void serve_pending_state_request() {
    if (!io || !io->state_requested()) return;
    auto bytes = save_training_state(model, inner.get(), extra_tensors());
    if (!bytes) {
      log()->warn("cannot serialise state for a peer: {}", bytes.error().message());
      return;
    }
    io->offer_state(epoch, std::move(bytes).value());
  }
};

Optimizer::Optimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

void Optimizer::serve_state_requests() {
  impl_->serve_pending_state_request();
}

Optimizer::~Optimizer() {
  if (impl_ && !impl_->shut_down) (void)shutdown(5s);
}

result<std::unique_ptr<Optimizer>> Optimizer::create(torch::nn::Module& model,
                                                     std::unique_ptr<torch::optim::Optimizer> inner,
                                                     OptimizerOptions options,
                                                     std::shared_ptr<Collaboration> collaboration) {
  ST_TRY(validate(options));
  if (!inner) return make_error(errc::invalid_argument, "optimizer: no inner optimizer");
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
    ST_TRY(auto dir, CheckpointDir::open(impl->opt.checkpoint_dir, impl->opt.checkpoints_kept));
    impl->ckpt = std::move(dir);
    NamedTensors extra = impl->extra_tensors();
    ST_TRY(auto meta, load_latest_checkpoint(*impl->ckpt, model, impl->inner.get(), &extra));
    if (meta) {
      if (meta->run_id != impl->opt.run_id)
        log()->warn("checkpoint is from run '{}', this is run '{}'", meta->run_id,
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
  if (collaboration) {
    ProgressTracker tracker(collaboration->self(), impl->progress_config());
    tracker.restore(impl->epoch, 0, samples_total);
    impl->io = OptimizerIo::start(std::move(collaboration), std::move(tracker), impl->opt);
  } else {
    auto self = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
    impl->local_tracker = std::make_unique<ProgressTracker>(self, impl->progress_config());
    impl->local_tracker->restore(impl->epoch, 0, samples_total);
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
  auto decision = m.with_tracker([&](ProgressTracker& t) {
    t.report_samples(batch_size, compute);
    return t.decide(Clock::now());
  });

  StepReport rep;
  rep.action = decision.action;
  switch (decision.action) {
    case Action::accumulate:
      break;
    case Action::begin_matchmaking:
      if (m.io && decision.view.eta)
        m.io->prepare_round(m.round_key(), Clock::now() + *decision.view.eta);
      break;
    case Action::step_alone:
      m.step_alone(rep);
      break;
    case Action::average_and_step:
      if (m.io)
        m.average_and_step(rep, decision.view.peers_at_global_epoch);
      else
        m.step_alone(rep);
      break;
    case Action::download_state:
      if (m.io) m.download(rep);
      break;
  }
  rep.epoch = m.epoch;
  m.stats.bytes_sent += rep.bytes_sent;
  m.stats.bytes_received += rep.bytes_received;
  m.last_step_end = Clock::now();
  return rep;
}

void Optimizer::zero_grad() {
  for (auto& p : impl_->params)
    if (p.mutable_grad().defined()) p.mutable_grad().zero_();
}

std::uint64_t Optimizer::local_epoch() const {
  return impl_->epoch;
}

OptimizerStatus Optimizer::status() const {
  auto& m = *impl_;
  OptimizerStatus s = m.stats;
  m.with_tracker([&](ProgressTracker& t) {
    s.local_epoch = t.local_epoch();
    s.local_samples = t.local_samples();
    s.samples_total = t.samples_total();
    s.local_samples_per_second = t.local_samples_per_second();
    s.collaboration = t.view(Clock::now());
    return 0;
  });
  return s;
}

torch::optim::Optimizer& Optimizer::inner() {
  return *impl_->inner;
}
const OptimizerOptions& Optimizer::options() const {
  return impl_->opt;
}
const std::optional<CheckpointMeta>& Optimizer::resumed_from() const {
  return impl_->resumed;
}

result<void> Optimizer::load_state_from_peers() {
  if (!impl_->io) return make_error(errc::unavailable, "optimizer: training alone, no peers");
  StepReport rep;
  impl_->retry_after = {};
  impl_->download(rep);
  if (rep.round_error) return *rep.round_error;
  return success();
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
  if (m.io) out = m.io->stop(timeout);
  if (m.ckpt) {
    auto r = m.save(0, 0);
    if (!r) {
      log()->warn("final checkpoint failed: {}", r.error().message());
      if (out) out = r.error();
    }
  }
  return out;
}

}  // namespace starling::optim
