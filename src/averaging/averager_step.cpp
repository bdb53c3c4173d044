// Averager::step() and early matchmaking (begin() / PendingStep): matchmaking, then the round
// with this member's data supplied before or after the group formed. See averager.hpp.
//
// Threading rule: the host's executor; the copies in and out run on the averager's pool.
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <fmt/format.h>

#include "averager_impl.hpp"
#include "starling/core/blocking.hpp"
#include "starling/core/log.hpp"
#include "starling/core/thread_pool.hpp"

namespace starling::averaging {
namespace {

// Copies between the caller's tensors and the flat vector on the pool (64 MB of memcpy would
// otherwise stall the I/O thread). Function objects: GCC 12 and lambdas in coroutines.
struct GatherTask {
  const std::vector<TensorView>* views;
  std::vector<float>* flat;
  void operator()() const { gather_flat(*views, 0, *flat); }
};
struct ScatterTask {
  const std::vector<TensorView>* views;
  const std::vector<float>* flat;
  void operator()() const { scatter_flat(*views, 0, *flat); }
};
// RoundRunnerConfig::on_peer_data: marks the step and tells its caller (a named function
// object, not a lambda in a coroutine: GCC 12).
struct PeerDataHook {
  std::weak_ptr<PendingStep::State> st;
  void operator()() const {
    auto s = st.lock();
    if (!s || s->peer_data) return;
    s->peer_data = true;
    if (s->on_peer_data) s->on_peer_data();
  }
};

Duration since(TimePoint from, TimePoint to) {
  return from == TimePoint{} || to == TimePoint{} || to < from ? Duration::zero() : to - from;
}

struct CopyTask {
  std::span<const float> from;
  std::span<float> to;
  void operator()() const { std::copy(from.begin(), from.end(), to.begin()); }
};

}  // namespace

awaitable<result<StepResult>> Averager::step(StepOptions opts) {
  StepData none;  // named: see docs/architecture.md on temporaries in co_await (GCC 12)
  co_return co_await step(std::move(opts), std::move(none));
}

awaitable<result<StepResult>> Averager::step(StepOptions opts, StepData data) {
  auto self = shared_from_this();
  const double weight = opts.weight;
  ST_CO_TRY(auto pending, begin(std::move(opts)));
  co_return co_await pending->run(weight, std::move(data));
}

result<std::shared_ptr<PendingStep>> Averager::begin(StepOptions opts) {
  if (impl_->stopped) return make_error(errc::closed, "averager: stopped");
  if (!impl_->started) start();
  if (impl_->stepping) return make_error(errc::already_exists, "averager: a step is running");
  if (!std::isfinite(opts.weight) || opts.weight < 0)
    return make_error(errc::invalid_argument, "averager: weight must be finite and >= 0");
  ST_TRY(GroupKey::valid_round(opts.round));
  impl_->stepping = true;
  auto st = std::make_shared<PendingStep::State>(host_->get_executor());
  st->avg = shared_from_this();
  st->t0 = Clock::now();
  st->deadline = st->t0 + opts.timeout;
  st->data_deadline = st->t0 + std::min(opts.data_timeout.value_or(opts.timeout / 2), opts.timeout);
  st->opts = std::move(opts);
  // Kept across steps: fresh 2 x 4n bytes every step cost more in page faults than the copies.
  impl_->local_buf.resize(schema_.numel());
  impl_->output_buf.resize(schema_.numel());
  impl_->step = st;
  // The step ends by its deadline; stop() ends it at once (PendingStep::end) and waits for it.
  impl_->steps.spawn(run_step(st));
  return std::make_shared<PendingStep>(st);
}

awaitable<void> Averager::run_step(std::shared_ptr<PendingStep::State> st) {
  auto self = shared_from_this();
  auto r = co_await step_body(st);
  st->runner.reset();
  impl_->stepping = false;
  st->outcome = std::move(r);
  st->done.set();
}

// Takes the step's data (the caller's buffers, or the tensors gathered into the step's input)
// and hands it to the round if it runs already.
awaitable<result<void>> Averager::supply(std::shared_ptr<PendingStep::State> st, double weight,
                                         StepData data) {
  auto self = shared_from_this();
  const std::uint64_t n = schema_.numel();
  if (data.input.data() || data.output.data()) {
    if (data.input.size() != n || data.output.size() != n)
      co_return make_error(errc::invalid_argument,
                           fmt::format("averager: step data has {} input and {} output elements, "
                                       "the schema {}",
                                       data.input.size(), data.output.size(), n));
  } else if (tensors_.empty() && !schema_.tensors.empty()) {
    co_return make_error(errc::invalid_argument,
                         "averager: created without tensors, a step needs its StepData");
  } else {
    GatherTask gather{&tensors_, &impl_->local_buf};
    ST_CO_TRY(co_await pool_->run(gather));
  }
  if (st->outcome) co_return success();  // over meanwhile: run() returns its outcome
  st->data = std::move(data);
  st->data_ready = true;
  st->weight = weight;
  if (st->runner) ST_CO_TRY(st->runner->provide_local(step_input(*st), weight, st->data.output));
  co_return success();
}

std::span<const float> Averager::step_input(const PendingStep::State& st) const {
  return st.data.input.data() ? st.data.input : std::span<const float>(impl_->local_buf);
}

awaitable<result<StepResult>> Averager::step_body(std::shared_ptr<PendingStep::State> st) {
  auto self = shared_from_this();
  const StepOptions& opts = st->opts;
  const TimePoint t0 = st->t0;
  const TimePoint deadline = st->deadline;
  const std::uint64_t n = schema_.numel();

  StepResult res;
  GroupInfo group;
  const bool matched = !opts.group;
  if (st->cancelled) co_return make_error(errc::cancelled, "averager: step cancelled");
  // Accountability: the run's accusations are read in the background (a slow directory must
  // not delay the step); bans apply as they come (matchmaking asks for each view).
  if (impl_->bans) {
    impl_->bans->tick(Clock::now());  // verdicts past their grace ban, even while a read hangs
    if (!impl_->polling) impl_->steps.spawn(poll_accusations());
  }
  if (opts.group) {
    group = *opts.group;
  } else {
    const Duration mm =
        opts.matchmaking_timeout.value_or(std::min<Duration>(opts.timeout / 2, 30s));
    const auto wnow = WallClock::now();
    MatchmakingConfig mcfg = cfg_.matchmaking;
    if (opts.min_group_size) mcfg.min_group_size = std::max<std::size_t>(1, *opts.min_group_size);
    if (opts.expected_group_size) mcfg.expected_size = *opts.expected_group_size;
    if (impl_->bans) mcfg.excluded = [this](const PeerKey& k) { return banned(k) || suspected(k); };
    const double join_weight = st->data_ready ? st->weight : opts.weight;
    MatchmakingCore core(mcfg, self_info(join_weight), schema_hash_, key_.with_round(opts.round),
                         wnow, wnow + std::chrono::duration_cast<WallClock::duration>(mm),
                         cfg_.seed ^ static_cast<std::uint64_t>(t0.time_since_epoch().count()));
    const WallTime match_deadline = wnow + std::chrono::duration_cast<WallClock::duration>(mm);
    auto session = std::make_shared<detail::MatchSession>(*host_, *directory_, std::move(core),
                                                          add_addresses_, cfg_.open_timeout,
                                                          impl_->join_protocol, cfg_.on_phase);
    session->set_gate(cfg_.gate);
    if (opts.reuse_group && reuse_last_group(mcfg))
      session->predict(predicted_view(match_deadline));
    impl_->match = session;
    st->match = session;
    impl_->match_started.pulse();
    auto g = co_await session->run();
    st->match.reset();
    impl_->match.reset();
    res.matched_directly = session->matched_directly();
    if (!g) {
      impl_->last_members.clear();
      co_return g.error();
    }
    group = std::move(g).value();
  }
  res.matchmaking_time = Clock::now() - t0;

  ST_CO_TRY(validate_members(group.members));
  for (const auto& m : group.members)
    if (banned(m.peer))
      co_return make_error(errc::invalid_argument, "averager: the group has a banned member");
  if (group.schema_hash != schema_hash_)
    co_return make_error(errc::invalid_argument, "averager: the group has another schema");
  const auto me = group.index_of(PeerKey(host_->local_peer().bytes()));
  if (!me) co_return make_error(errc::invalid_argument, "averager: this peer is not in the group");
  if (matched && cfg_.gate) ST_CO_TRY(co_await check_members(group, *me));
  std::vector<net::PeerId> peers;
  for (const auto& m : group.members) {
    auto id = net::PeerId::from_bytes(m.peer.bytes());
    if (!id) co_return make_error(errc::invalid_argument, "averager: bad peer id in the group");
    if (add_addresses_ && !m.addrs.empty() && m.peer != group.members[*me].peer)
      add_addresses_(id.value(), m.addrs);
    peers.push_back(std::move(id).value());
  }

  detail::RoundRunnerConfig rcfg;
  rcfg.round = cfg_.round;
  rcfg.keepalive_interval = cfg_.keepalive_interval;
  rcfg.open_timeout = cfg_.open_timeout;
  rcfg.protocol = impl_->allreduce_protocol;
  rcfg.on_phase = cfg_.on_phase;
  rcfg.stall = cfg_.test_stall;
  rcfg.codecs = &impl_->codecs;
  rcfg.upload_rate = cfg_.upload_pace * static_cast<double>(cfg_.bandwidth);
  rcfg.upload_burst = cfg_.upload_burst;
  rcfg.acct = round_acct(opts.round);
  rcfg.on_peer_data = PeerDataHook{st};
  // Error feedback: this step starts from the residual of earlier steps and commits the new
  // one only if it succeeds (on failure nothing was applied, so nothing was lost).
  std::vector<float> residual_out, result_residual_out;
  if (cfg_.error_feedback && impl_->codecs.compressed()) {
    if (impl_->residual.size() != n) impl_->residual.assign(n, 0.0f);
    if (impl_->result_residual.size() != n) impl_->result_residual.assign(n, 0.0f);
    residual_out = impl_->residual;
    result_residual_out = impl_->result_residual;
    rcfg.residual = impl_->residual;
    rcfg.residual_out = residual_out;
    rcfg.result_residual = impl_->result_residual;
    rcfg.result_residual_out = result_residual_out;
  }
  // Without data yet the round runs with an empty input: the core takes part (streams,
  // keepalives, receiving) and sends its parts when supply() provides them.
  std::span<const float> input;
  if (st->data_ready) {
    input = step_input(*st);
    group.members[*me].weight = st->weight;
  }
  // The round writes the result straight into the caller's output when it gave one (the data
  // may come later: the caller's output is known only then, so an early step uses its own).
  const bool direct = st->data_ready && st->data.output.data();
  std::span<float> output = direct ? st->data.output : std::span<float>(impl_->output_buf);
  const TimePoint t1 = Clock::now();
  auto runner = std::make_shared<detail::RoundRunner>(
      *host_, group, static_cast<std::uint32_t>(*me), peers, input, output, rcfg, deadline, *pool_);
  if (!st->data_ready) runner->set_local_deadline(st->data_deadline);
  if (st->cancelled)
    runner->abandon(Error(errc::cancelled, "averager: step cancelled before its data came"));
  st->runner = runner;
  st->grouped = true;
  impl_->rounds[group.group_id] = runner;
  impl_->round_registered.pulse();
  auto r = co_await runner->settle();
  if (r) r = co_await runner->close();
  impl_->rounds.erase(group.group_id);
  st->runner.reset();
  impl_->last_members.clear();
  if (r && matched && key_.config().dims == 0) impl_->last_members = group.members;
  res.allreduce_time = Clock::now() - t1;
  const auto& tl = runner->times();
  res.data_wait = since(tl.start, tl.local);
  res.peer_wait = since(tl.local, tl.inputs);
  res.exchange_time = since(std::max(tl.local, tl.inputs), tl.done);
  res.close_time = since(tl.done, tl.closed);
  res.bytes_sent = runner->bytes_sent();
  res.bytes_received = runner->bytes_received();
  res.codec_time = runner->codec_time();
  res.checked_parts = runner->checked_parts();
  res.evidence_found = runner->evidence_found();
  res.grad_samples = runner->take_grad_samples();
  if (!r) co_return r.error();

  if (st->data.output.data() && !direct && !runner->output_retargeted()) {
    // The data came after the round began (early matchmaking): one copy, on the pool.
    CopyTask copy{impl_->output_buf, st->data.output};
    ST_CO_TRY(co_await pool_->run(copy));
  } else if (!direct) {
    ScatterTask scatter{&tensors_, &impl_->output_buf};
    ST_CO_TRY(co_await pool_->run(scatter));
  }
  if (!residual_out.empty()) {
    impl_->residual.swap(residual_out);
    impl_->result_residual.swap(result_residual_out);
  }
  if (matched)
    key_ = key_.next(static_cast<std::uint32_t>(*me),
                     static_cast<std::uint32_t>(group.members.size()));
  res.my_index = static_cast<std::uint32_t>(*me);
  res.subrounds = runner->core().subround() + 1;
  const auto& counted = runner->core().counted_elements();
  for (std::uint32_t i = 0; i < group.members.size(); ++i)
    res.contributions.push_back(
        {group.members[i].peer, runner->core().weight_of(i), group.members[i].client, counted[i]});
  res.group = std::move(group);
  res.total_time = Clock::now() - t0;
  co_return res;
}

// A private run: every other member of a group must be admitted by the gate (the leader admits
// its followers; this catches a leader that let a non-member in, or a member revoked since).
awaitable<result<void>> Averager::check_members(const GroupInfo& group, std::size_t me) {
  auto self = shared_from_this();
  auto gate = cfg_.gate;
  for (std::size_t i = 0; i < group.members.size(); ++i) {
    if (i == me) continue;
    auto id = net::PeerId::from_bytes(group.members[i].peer.bytes());
    if (!id) co_return make_error(errc::invalid_argument, "averager: bad peer id in the group");
    const bool admitted = co_await gate->admit(id.value());
    if (!admitted)
      co_return make_error(errc::permission, "averager: group member " + id.value().short_string() +
                                                 " is not a member of this run");
  }
  co_return success();
}

bool Averager::reuse_last_group(const MatchmakingConfig& m) const {
  const auto n = impl_->last_members.size();
  return cfg_.reuse_group && key_.config().dims == 0 && n >= 2 && m.expected_size == n &&
         n >= m.min_group_size && n <= m.target_group_size;
}

std::vector<MatchEntry> Averager::predicted_view(WallTime deadline) const {
  std::vector<MatchEntry> view;
  for (const auto& m : impl_->last_members) {
    MatchEntry e;
    e.info = m;
    e.info.weight = 0;
    e.schema_hash = schema_hash_;
    e.deadline = deadline;
    view.push_back(std::move(e));
  }
  return view;
}

// --- PendingStep ----------------------------------------------------------------------------

awaitable<result<StepResult>> PendingStep::run(double weight) {
  StepData none;  // named: see docs/architecture.md on temporaries in co_await (GCC 12)
  co_return co_await run(weight, std::move(none));
}

awaitable<result<StepResult>> PendingStep::run(double weight, StepData data) {
  auto st = st_;
  if (st->run_called)
    co_return make_error(errc::already_exists, "averager: run() was called for this step");
  st->run_called = true;
  if (st->cancelled) co_return make_error(errc::cancelled, "averager: step cancelled");
  if (!std::isfinite(weight) || weight < 0) {
    cancel();
    co_return make_error(errc::invalid_argument, "averager: weight must be finite and >= 0");
  }
  if (!st->outcome) {
    auto s = co_await st->avg->supply(st, weight, std::move(data));
    if (!s) {
      cancel();
      co_return s.error();
    }
  }
  const Duration limit = std::max<Duration>(st->deadline - Clock::now(), 0s) + 30s;
  (void)co_await with_timeout(st->done.wait(), limit, "averaging step");
  if (!st->outcome) co_return make_error(errc::timeout, "averager: step did not end");
  co_return *st->outcome;
}

result<StepResult> PendingStep::run_blocking(double weight) {
  auto st = st_;
  PendingStep self(st);
  const Duration limit = std::max<Duration>(st->deadline - Clock::now(), 0s) + 60s;
  return block_on(
      st->avg->host().get_executor(), [self, weight]() mutable { return self.run(weight); }, limit);
}

void PendingStep::cancel() {
  if (st_->cancelled || st_->outcome) return;
  st_->cancelled = true;
  if (st_->match) st_->match->cancel("step cancelled");
  if (st_->runner && !st_->data_ready)
    st_->runner->abandon(Error(errc::cancelled, "averager: step cancelled before its data came"));
}

void PendingStep::end(const std::string& why) {
  cancel();
  if (st_->runner && !st_->outcome) st_->runner->abandon(Error(errc::cancelled, why));
}

awaitable<bool> PendingStep::wait(TimePoint until) {
  auto st = st_;
  if (st->outcome) co_return true;
  (void)co_await with_timeout(st->done.wait(), std::max<Duration>(until - Clock::now(), 1ms),
                              "averaging step end");
  co_return st->outcome.has_value();
}

void PendingStep::on_peer_data(std::function<void()> f) {
  st_->on_peer_data = std::move(f);
}

bool PendingStep::peer_data() const {
  return st_->peer_data;
}

bool PendingStep::grouped() const {
  return st_->grouped;
}

bool PendingStep::finished() const {
  return st_->outcome.has_value();
}

}  // namespace starling::averaging
