// starling::Optimizer's averaging rounds (training thread): the contribution, the round over
// it (training::RoundData: the flat contribution in, the group's average out, no copies),
// early matchmaking, failures and retries, applying the result. See optimizer_impl.hpp.
#include <cmath>

#include "optimizer_impl.hpp"

namespace starling::optim {

torch::Tensor Optimizer::Impl::contribution() {
  torch::NoGradGuard no_grad;
  if (opt.diloco_steps > 0) {
    auto pg = diloco.pseudo_gradient(params);
    std::vector<torch::Tensor> flat;
    for (auto& t : pg) flat.push_back(t.detach().to(torch::kCPU, torch::kFloat32).reshape({-1}));
    return torch::cat(flat);
  }
  momentum_pending = torch::Tensor();
  if (local_samples == 0) return torch::zeros_like(acc_flat);  // weight 0: not counted
  auto g = acc_flat / static_cast<double>(local_samples);
  if (!(opt.worker_momentum > 0)) return g;
  const double b = opt.worker_momentum;
  momentum_pending = momentum.defined() ? momentum * b + g * (1 - b) : g * (1 - b);
  return momentum_pending / (1 - std::pow(b, static_cast<double>(momentum_count + 1)));
}

void Optimizer::Impl::commit_contribution() {
  if (!momentum_pending.defined()) return;
  momentum = std::move(momentum_pending);
  momentum_pending = torch::Tensor();
  ++momentum_count;
}

void Optimizer::Impl::apply(const torch::Tensor& averaged) {
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

std::string Optimizer::Impl::round_key() const {
  return fmt::format("{}/{}", opt.diloco_steps > 0 ? "outer" : "grads", epoch);
}

void Optimizer::Impl::step_alone(StepReport& rep) {
  auto c = contribution();
  rep.group_size = 1;
  rep.group_samples = static_cast<double>(local_samples);
  apply(c);
  commit_contribution();
  publish_master();
  rep.stepped = true;
  finish_epoch(epoch + 1);
}

void Optimizer::Impl::expect_members(training::RoundOptions& ro,
                                     const training::CollaborationView& v) const {
  ro.expected_members = v.majority_base;
  ro.expected_group = v.global_epoch == epoch ? v.all_at_epoch : 0;
  ro.live_peers = v.num_peers;
}

Optimizer::Impl::Round Optimizer::Impl::make_round(torch::Tensor mine,
                                                   const training::CollaborationView& v) {
  Round r;
  r.result = torch::empty_like(mine);
  const auto n = static_cast<std::size_t>(mine.numel());
  r.data.input = std::span<const float>(mine.data_ptr<float>(), n);
  r.data.output = std::span<float>(r.result.data_ptr<float>(), n);
  r.data.owner = std::make_shared<std::pair<torch::Tensor, torch::Tensor>>(mine, r.result);
  r.data.layout = layout();
  training::RoundOptions& ro = r.options;
  ro.key = round_key();
  ro.weight = static_cast<double>(local_samples);
  ro.deadline = Clock::now() + opt.averaging_timeout;
  ro.compression = opt.grad_compression;
  expect_members(ro, v);
  return r;
}

training::Layout Optimizer::Impl::layout() const {
  training::Layout l;
  for (std::size_t i = 0; i < params.size(); ++i)
    l.emplace_back(names[i], static_cast<std::size_t>(params[i].numel()));
  return l;
}

void Optimizer::Impl::prepare_round(const training::CollaborationView& v) {
  if (!io || !v.eta) return;
  training::RoundPlan p;
  p.expected_start = Clock::now() + *v.eta;
  p.options.key = round_key();
  p.options.weight = opt.auxiliary ? 0.0 : static_cast<double>(local_samples);
  p.options.deadline = p.expected_start + opt.averaging_timeout;
  p.options.compression = opt.grad_compression;
  expect_members(p.options, v);
  p.layout = layout();
  io->prepare_round(std::move(p));
}

result<training::RoundResult> Optimizer::Impl::run_round(const Round& round, bool serve) {
  const training::RoundOptions& ro = round.options;
  std::function<void()> waiting;
  if (serve) waiting = [this] { serve_pending_state_request(); };
  auto r = io->average(round.data, ro, opt.averaging_timeout + opt.io_grace, std::move(waiting));
  // A group of one means the others were not there (they stepped already, or are behind):
  // applying our own gradients alone would fork the parameters at this epoch.
  if (r && r.value().members.size() < 2)
    r = make_error(errc::unavailable, fmt::format("round {}: no other peer joined", ro.key));
  return r;
}

void Optimizer::Impl::note_round(StepReport& rep, const training::RoundResult& r) {
  ++stats.rounds_ok;
  rep.group_size = r.members.size();
  rep.group_samples = r.total_weight;
  rep.bytes_sent = r.bytes_sent;
  rep.bytes_received = r.bytes_received;
  rep.matchmaking_time = r.matchmaking_time;
  rep.allreduce_time = r.allreduce_time;
}

void Optimizer::Impl::round_failed(StepReport& rep, const Error& e) {
  rep.round_error = e;
  ++stats.rounds_failed;
  round_retry_after = Clock::now() + opt.retry_backoff;
  const bool alone = with_tracker([](training::ProgressTracker& t) {
    t.round_failed(Clock::now());
    return t.may_step_alone(Clock::now());
  });
  if (++failed_rounds < opt.max_failed_rounds) {
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

void Optimizer::Impl::check_contributions(const training::RoundResult& r) {
  if (!opt.check_contribution) return;
  for (const auto& s : r.grad_samples) {
    const auto t0 = Clock::now();
    auto why = opt.check_contribution(s, epoch);
    stats.grad_check_time += Clock::now() - t0;
    ++stats.grad_checks;
    if (!why) continue;
    ++stats.grad_check_failures;
    log()->warn("epoch {}: gradient check of peer {} failed: {}", epoch, s.peer.short_string(),
                *why);
    io->convict(s.peer, "gradient check: " + *why);
  }
}

void Optimizer::Impl::average_and_step(StepReport& rep, const training::CollaborationView& v) {
  const TimePoint t_in = Clock::now();
  if (t_in < round_retry_after) return;
  auto round = make_round(contribution().contiguous(), v);
  auto t0 = Clock::now();
  auto r = run_round(round, true);  // the parameters do not change meanwhile
  const TimePoint t1 = Clock::now();
  rep.averaging_time = t1 - t0;
  if (!r) {
    round_failed(rep, r.error());
    return;
  }
  note_round(rep, r.value());
  check_contributions(r.value());
  apply(round.result);
  commit_contribution();
  publish_master();
  const TimePoint t2 = Clock::now();
  rep.stepped = true;
  finish_epoch(epoch + 1, &r.value());
  // The training thread's side of a synchronous step (debug): before the round (the
  // contribution), the round as the training thread waited for it, applying it, finishing the
  // epoch, and the time spent in step() during this epoch before it (accumulating, deciding).
  const TimePoint t3 = Clock::now();
  auto ms = [](Duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  log()->debug(
      "epoch {}: step: contribution {:.1f} ms, round {:.1f} ms, apply {:.1f} ms, finish {:.1f} "
      "ms; earlier steps of the epoch {:.1f} ms",
      epoch - 1, ms(t0 - t_in), ms(t1 - t0), ms(t2 - t1), ms(t3 - t2),
      ms(stats.step_time - step_time_at_epoch));
  step_time_at_epoch = stats.step_time;
}
}  // namespace starling::optim
