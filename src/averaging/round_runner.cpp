// RoundRunner: the round's lifecycle (streams opened and accepted, timers, the core's outbox
// and reductions pumped). The end (drained and closed): round_runner_end.cpp; balanced progress
// across the writers: round_runner_balance.cpp; per-stream I/O: round_runner_io.cpp.
#include "round_runner.hpp"

#include <cmath>

#include "starling/core/log.hpp"
#include "starling/core/thread_pool.hpp"

namespace starling::averaging::detail {

namespace {

std::vector<RoundMember> round_members(const GroupInfo& g) {
  std::vector<RoundMember> out;
  for (const auto& m : g.members) out.push_back({{m.bandwidth, m.client}, m.weight});
  return out;
}

RoundConfig offloaded(RoundConfig c) {
  c.inline_reduce = false;
  return c;
}

// A pool task as a plain function object (GCC 12 mishandles lambdas nested in coroutines).
// Runs one reduction; with a codec, then encodes the reduced part and replaces it by its
// decoded form, so that the owner holds exactly what every other member will decode. With
// accountability, CenteredClip runs until its fixed point passes the members' check, and the
// result's hash and norm go into its receipt.
struct ReduceOut {
  Bytes encoded;
  ResultStat stat;
  std::vector<std::vector<float>> kept;  // accountability: the inputs, to answer a lying report
};
struct ReduceTask {
  ReduceJob job;
  std::shared_ptr<PoolGate> gate;
  const std::function<void(std::uint32_t)>* before;  // test hook (may be empty)
  const TensorCodecs* codecs;                        // null: uncompressed, nothing to encode
  std::uint64_t begin;
  std::span<const float> residual;
  std::span<float> residual_out;
  std::atomic<std::int64_t>* ns;
  const RoundAcctConfig* acct = nullptr;
  result<ReduceOut> operator()() const {
    if (*before) (*before)(job.part);
    PoolGate::Pass pass(gate.get());
    if (!pass.ok) return make_error(errc::cancelled, "all-reduce: the round ended");
    ReduceOut out;
    if (acct && job.aggregation.kind == Aggregation::centered_clip && !job.inputs.empty()) {
      const auto c = acct::centered_clip_checked(job.out, job.inputs, job.weights, job.aggregation,
                                                 acct->check);
      out.stat.clip = true;
      out.stat.tau = c.stats.tau;
    } else {
      run_reduce_job(job);
    }
    if (acct) {
      for (const auto& in : job.inputs) out.kept.emplace_back(in.begin(), in.end());
      if (acct->attack == RoundAttack::wrong_average) shift(job.out);
      double s = 0;
      for (float x : job.out) s += static_cast<double>(x) * x;
      out.stat.norm = std::sqrt(s);
      out.stat.hash = acct::hash_floats(job.out);
    }
    if (!codecs) return out;
    Timed t{ns};
    ST_TRY(out.encoded, codecs->encode(begin, job.out, job.out, residual, residual_out));
    return out;
  }
  // Test-only wrong-average: moves the result by a tenth of its RMS.
  static void shift(std::span<float> v) {
    double s = 0;
    for (float x : v) s += static_cast<double>(x) * x;
    const float d =
        static_cast<float>(0.1 * std::sqrt(s / std::max<std::size_t>(1, v.size()))) + 1e-3f;
    for (auto& x : v) x += d;
  }
};

}  // namespace

RoundRunner::RoundRunner(net::StreamHost& host, GroupInfo group, std::uint32_t self,
                         std::vector<net::PeerId> peers, std::span<const float> local,
                         std::span<float> output, RoundRunnerConfig cfg, TimePoint deadline,
                         ThreadPool& pool)
    : host_(host),
      group_(std::move(group)),
      self_(self),
      n_(static_cast<std::uint32_t>(group_.members.size())),
      peers_(std::move(peers)),
      cfg_(cfg),
      deadline_(deadline),
      pool_(pool),
      ex_(host.get_executor()),
      local_(local),
      output_(output),
      core_(round_members(group_), self, local, output, offloaded(cfg.round), Clock::now(),
            deadline),
      p_(n_),
      scope_(ex_),
      timer_(ex_),
      done_(ex_),
      progress_(ex_),
      balance_(ex_),
      pool_idle_(ex_) {
  for (auto& p : p_) p.wake = std::make_unique<AsyncEvent>(ex_);
  pacer_.rate = cfg_.upload_rate;
  pacer_.burst = static_cast<double>(cfg_.upload_burst);
}

RoundRunner::~RoundRunner() = default;

awaitable<result<void>> RoundRunner::run() {
  auto self = shared_from_this();
  ST_CO_TRY(co_await settle());
  co_return co_await close();
}

awaitable<result<void>> RoundRunner::settle() {
  auto self = shared_from_this();
  started_ = Clock::now();
  times_.start = started_;
  if (!core_.local_pending()) times_.local = started_;
  ST_CO_TRY(acct_init());
  ST_CO_TRY(core_.start(started_));
  const bool i_am_client = group_.members[self_].client;
  for (std::uint32_t j = 0; j < n_; ++j) {
    if (j == self_) continue;
    const bool j_client = group_.members[j].client;
    if (i_am_client && j_client) continue;  // two clients never talk
    if (!j_client) scope_.spawn(connect(j));
    scope_.spawn(writer(j));
  }
  scope_.spawn(timer_loop());
  pump();

  const auto budget = deadline_ - Clock::now() + cfg_.linger;
  (void)co_await with_timeout(done_.wait(), budget, "all-reduce round");
  if (acct_ && core_.status() == RoundCore::Status::done) co_await acct_phase();
  co_return success();
}

awaitable<void> RoundRunner::connect(std::uint32_t j) {
  auto s = co_await host_.open_stream(peers_[j], cfg_.protocol, cfg_.open_timeout);
  if (!s) {
    stream_lost(j, s.error(), false);
    co_return;
  }
  auto stream = s.value();
  auto hello = net::length_prefixed(wire::encode_hello({group_.group_id, self_, j}));
  auto w = co_await stream->write(hello);
  if (!w) {
    stream_lost(j, w.error(), false);
    stream->reset();
    co_return;
  }
  bytes_sent_ += hello.size();
  logger("averaging")
      ->debug(
          "all-reduce: member {} connected to {} after {} ms", self_, j,
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started_).count());
  if (p_[j].fenced || ending_) {
    stream->reset();
    co_return;
  }
  p_[j].send = stream;
  p_[j].streams.push_back(stream);
  p_[j].wake->set();
  co_await reader(j, stream, nullptr);
}

awaitable<void> RoundRunner::serve_inbound(std::uint32_t from, net::ByteStreamPtr stream,
                                           std::shared_ptr<net::BufferedReader> reader_) {
  auto self = shared_from_this();
  if (from >= n_ || from == self_ || p_[from].fenced || p_[from].inbound_seen || ending_ ||
      group_.members[self_].client) {
    stream->reset();
    co_return;
  }
  p_[from].inbound_seen = true;
  // Its hello arrived: it has connected, so the connecting grace ends and the stall timeout
  // runs from now (a connected member that sends nothing more, no keepalive either, is dropped
  // after stall_timeout, not after open_timeout + stall_timeout).
  p_[from].heard = true;
  core_.on_activity(from, Clock::now());
  logger("averaging")
      ->debug(
          "all-reduce: member {} heard from {} after {} ms", self_, from,
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started_).count());
  p_[from].streams.push_back(stream);
  if (group_.members[from].client) {
    p_[from].send = stream;
    p_[from].wake->set();
  }
  co_await reader(from, stream, std::move(reader_));
}

result<void> RoundRunner::provide_local(std::span<const float> local, double weight,
                                        std::span<float> output) {
  if (!output.empty() && core_.local_pending() && core_.retarget_output(output)) {
    output_ = output;
    retargeted_ = true;
  }
  local_ = local;
  auto r = core_.provide_local(local, weight, Clock::now());
  if (times_.local == TimePoint{}) times_.local = Clock::now();
  pump();
  return r;
}

void RoundRunner::abandon(Error e) {
  core_.abandon(std::move(e));
  pump();
}

awaitable<void> RoundRunner::timer_loop() {
  auto self = shared_from_this();
  while (core_.status() == RoundCore::Status::running && !ending_) {
    if (core_.local_pending() && Clock::now() >= local_deadline_) {
      abandon(Error(errc::timeout, "all-reduce: this member's data did not come by its deadline"));
      co_return;
    }
    auto wake = core_.next_wakeup();
    if (core_.local_pending()) wake = std::min(wake, local_deadline_);
    timer_.expires_at(wake);
    (void)co_await timer_.async_wait(use_nothrow);
    auto cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none) co_return;
    if (ending_) co_return;
    connecting_grace(Clock::now());
    core_.tick(Clock::now());
    pump();
  }
}

// A peer we have not heard from yet is being connected to (or is connecting to us): that is
// bounded by open_timeout, not by the stall timeout, so count it as active meanwhile.
void RoundRunner::connecting_grace(TimePoint now) {
  if (now >= started_ + cfg_.open_timeout) return;
  const bool i_am_client = group_.members[self_].client;
  for (std::uint32_t j = 0; j < n_; ++j) {
    if (j == self_ || p_[j].fenced) continue;
    const bool j_client = group_.members[j].client;
    if (i_am_client && j_client) continue;
    // Until j's first frame arrives, j may still be dialling, handshaking or negotiating.
    if (!p_[j].heard) core_.on_activity(j, now);
  }
}

// One reduction on the pool (and with a lossy codec the encoding of its result, which the
// owner sends once to every member), then the core sends the result.
awaitable<void> RoundRunner::reduce_part(ReduceJob job) {
  auto self = shared_from_this();
  PoolUse use(this, true);  // counted by pump()
  const std::uint32_t sub = job.subround, part = job.part;
  const auto begin = static_cast<std::uint64_t>(job.out.data() - output_.data());
  ReduceTask task{std::move(job),
                  gate_,
                  &cfg_.before_reduce,
                  compressed() ? cfg_.codecs : nullptr,
                  begin,
                  {},
                  {},
                  &codec_ns_,
                  cfg_.acct.get()};
  if (task.codecs && !cfg_.result_residual.empty() &&
      begin + task.job.out.size() <= output_.size()) {
    task.residual = cfg_.result_residual.subspan(begin, task.job.out.size());
    task.residual_out = cfg_.result_residual_out.subspan(begin, task.job.out.size());
  }
  auto e = co_await pool_.run(std::move(task));
  if (!e) {
    logger("averaging")
        ->warn("all-reduce: cannot reduce or encode part {}: {}", part, e.error().message());
    co_return;  // the round ends by its deadline; members see this owner fail
  }
  if (acct_) {
    acct_->set_result(sub, part, e.value().stat);
    acct_->keep_inputs(sub, part, std::move(e.value().kept));
  }
  if (compressed())
    encoded_results_[{sub, part}] = std::make_shared<const Bytes>(std::move(e.value().encoded));
  core_.on_reduced(sub, part, Clock::now());
  pump();
}

void RoundRunner::stream_lost(std::uint32_t j, const Error& e, bool blame) {
  p_[j].lost = true;
  acct_event_.set();
  if (blame)
    logger("averaging")->warn("all-reduce: member {} sent malformed data: {}", j, e.message());
  if (core_.status() == RoundCore::Status::running && !core_.failed().test(j))
    core_.on_peer_failed(j, e.message(), Clock::now(), blame);
  pump();
}

// Our stream to a non-client, and (when we are a non-client) the one j opens to us.
std::uint32_t RoundRunner::expected_streams(std::uint32_t j) const {
  const bool i_am_client = group_.members[self_].client;
  return (group_.members[j].client ? 0u : 1u) + (i_am_client ? 0u : 1u);
}

// One stream's EOF says nothing about j's other stream, which may still carry frames (yamux
// streams are independent): the core learns that j closed only when every stream has ended.
void RoundRunner::stream_ended(std::uint32_t j) {
  auto& P = p_[j];
  acct_event_.set();
  if (++P.ended < expected_streams(j)) return;
  if (core_.status() == RoundCore::Status::running && !core_.failed().test(j))
    core_.on_peer_closed(j, Clock::now());
  pump();
}

void RoundRunner::fence(std::uint32_t j) {
  auto& P = p_[j];
  P.fenced = true;
  balance_.pulse();
  for (auto& s : P.streams) s->reset();
  P.queue.clear();
  P.wake->set();
}

void RoundRunner::note_times() {
  const auto ph = core_.phase();
  if (times_.inputs == TimePoint{} && !core_.local_pending() && ph != "reduce-scatter" &&
      ph != "failed")
    times_.inputs = Clock::now();
  if (times_.done == TimePoint{} && core_.status() == RoundCore::Status::done)
    times_.done = Clock::now();
}

// A plain mean of a small part (no codec, no accountability, no test hook) costs less than the
// two thread switches of a pool task, which on a loaded machine are each a wait for a core.
bool RoundRunner::reduce_here(const ReduceJob& job) const {
  if (compressed() || acct_ || cfg_.before_reduce || job.aggregation.kind != Aggregation::mean)
    return false;
  return job.out.size() * (job.inputs.size() + 1) <= kInlineReduceValues;
}

void RoundRunner::pump() {
  balance_plan();
  for (bool again = true; again;) {
    again = false;
    for (auto& env : core_.take_outbox()) route(std::move(env));
    for (auto& job : core_.take_reduce_jobs()) {
      if (scope_.closed()) break;  // the round is over: a task would not start
      if (reduce_here(job)) {
        run_reduce_job(job);
        core_.on_reduced(job.subround, job.part, Clock::now());
        again = true;  // its result is in the outbox now
        continue;
      }
      ++pool_tasks_;
      scope_.spawn(reduce_part(std::move(job)));
    }
  }
  for (std::uint32_t j = 0; j < n_; ++j)
    if (j != self_ && core_.failed().test(j) && !p_[j].fenced) fence(j);
  if (core_.status() != RoundCore::Status::running) done_.set();
  note_times();
  timer_.cancel();
  if (auto ph = core_.phase(); ph != last_phase_) {
    last_phase_ = ph;
    logger("averaging")
        ->debug(
            "all-reduce: member {} enters {} after {} ms", self_, ph,
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started_).count());
    if (cfg_.on_phase) cfg_.on_phase(ph);
  }
}

}  // namespace starling::averaging::detail
