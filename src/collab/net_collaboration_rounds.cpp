// NetCollaboration's averaging rounds (net_collaboration.hpp): Averager steps on the gradient
// averager, begun early by prepare_round() or fresh by average().
#include <algorithm>
#include <cmath>
#include <random>

#include "net_collaboration_impl.hpp"
#include "starling/averaging/host_address_sink.hpp"
#include "starling/core/log.hpp"

namespace starling::collab {
namespace {

auto log() {
  return logger("collab");
}

const char* codec_of(training::Compression c) {
  switch (c) {
    case training::Compression::float16:
      return "float16";
    case training::Compression::uint8:
      return "blockwise8";
    case training::Compression::none:
      break;
  }
  return "none";
}

double secs(Duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

result<void> NetCollaboration::ensure_grads(const Layout& layout, training::Compression c) {
  // Accountability covers uncompressed parts only.
  if (cfg_.verify) c = training::Compression::none;
  if (impl_->grads && layout == impl_->layout && c == impl_->compression) return success();
  if (impl_->grads) {
    // Another layout or codec: a new averager (the old one's handlers go, and with them a
    // round prepared on it).
    cancel_prepared_round();
    auto old = impl_->grads;
    impl_->scope.spawn([old]() -> awaitable<void> { co_await old->stop(); });
    impl_->grads.reset();
    impl_->cancelled.reset();
  }
  averaging::Schema schema;
  schema.codec = codec_of(c);

  for (const auto& [name, n] : layout)
    schema.tensors.push_back({name, {static_cast<std::int64_t>(n)}, averaging::DType::f32});
  averaging::AveragerConfig ac;
  ac.gate = impl_->members;  // a private run: members only
  ac.key = {cfg_.run_id + ".grads", 16, 0};
  ac.matchmaking = cfg_.matchmaking;
  ac.round.stall_timeout = cfg_.stall_timeout;
  ac.round.aggregation = cfg_.aggregation;
  ac.bandwidth = cfg_.bandwidth;
  ac.upload_pace = cfg_.upload_pace;
  ac.client_mode = cfg_.client_mode;
  ac.client_now = cfg_.client_now;
  ac.addrs = cfg_.addrs;
  ac.open_timeout = cfg_.open_timeout;
  ac.reduce_threads = cfg_.reduce_threads;
  ac.error_feedback = cfg_.error_feedback && c != training::Compression::none;
  ac.accountability.enabled = cfg_.verify;
  ac.accountability.run = cfg_.run_id;
  ac.accountability.bans = impl_->bans;
  ac.accountability.grad_check_targets = cfg_.grad_check_targets;
  using Attack = NetCollaborationConfig::Attack;
  using AcctAttack = averaging::AccountabilityConfig::Attack;
  if (cfg_.attack == Attack::wrong_average) ac.accountability.attack = AcctAttack::wrong_average;
  if (cfg_.attack == Attack::different_parts)
    ac.accountability.attack = AcctAttack::different_parts;
  if (cfg_.attack == Attack::false_report) ac.accountability.attack = AcctAttack::false_report;
  if (cfg_.attack == Attack::directory_lie) ac.accountability.attack = AcctAttack::directory_lie;
  ac.test_stall = cfg_.attack == Attack::stall;
  ac.on_phase = [me = host_->local_peer().short_string()](const std::string& ph) {
    log()->debug("{}: {}", me, ph);
  };
  auto sink = averaging::host_address_sink(host_);
  ST_TRY(auto avg,
         averaging::Averager::create(host_, impl_->directory, std::move(schema), {}, ac, sink));
  avg->start();
  impl_->grads = avg;
  impl_->layout = layout;
  impl_->compression = c;
  return success();
}

averaging::StepOptions NetCollaboration::step_options(const training::RoundOptions& o) const {
  averaging::StepOptions so;
  so.weight = o.weight;
  so.round = o.key;
  so.timeout = std::max<Duration>(o.deadline - Clock::now(), 100ms);
  so.matchmaking_timeout = std::min<Duration>(so.timeout / 2, 30s);
  // A strict majority of the peers expected at this epoch: two disjoint groups can never both
  // succeed, so the parameters of successful peers never fork.
  so.min_group_size =
      std::max<std::size_t>(cfg_.matchmaking.min_group_size, o.expected_members / 2 + 1);
  // CenteredClip bounds a minority's pull; in a group of two the other member is half of it
  // (and the median weight cap is the pair's mean): a hostile peer paired with one honest peer
  // would own the step. Robust rounds therefore need three members.
  if (cfg_.aggregation.kind == averaging::Aggregation::centered_clip)
    so.min_group_size = std::max<std::size_t>(*so.min_group_size, 3);
  // Every live peer is at this epoch: the leader begins once all of them joined rather than
  // after min_wait (a group of one is no round, so a hint below 2 says nothing).
  if (o.expected_group >= 2) so.expected_group_size = o.expected_group;
  // A live peer outside the expected ones (behind, downloading the state) must find the round
  // in the DHT when it catches up: no intact-group shortcut then (a group that kept matching
  // directly would run ahead of it for good).
  so.reuse_group = o.live_peers != 0 && o.live_peers == o.expected_group;
  return so;
}

// --- early matchmaking ----------------------------------------------------------------------

void NetCollaboration::prepare_round(const training::RoundPlan& plan) {
  if (impl_->stopped) return;
  const std::string& key = plan.options.key;
  if (impl_->prepared && impl_->prepared->key == key && !impl_->prepared->step->finished())
    return;  // prepared already
  cancel_prepared_round();
  if (impl_->cancelled && !impl_->cancelled->finished()) {
    // The averager runs one step at a time; average() will begin a fresh one.
    log()->debug("round {}: no early matchmaking, a cancelled step is still matchmaking", key);
    return;
  }
  if (auto ok = ensure_grads(plan.layout, plan.options.compression); !ok) {
    log()->info("round {}: no early matchmaking: {}", key, ok.error().message());
    return;
  }
  // The round's own time starts at the expected start: matchmaking may take until then plus
  // the usual half of the round, the data may come until then plus half of the round.
  auto so = step_options(plan.options);
  const Duration lead =
      std::clamp<Duration>(plan.expected_start - Clock::now(), Duration::zero(), so.timeout);
  const Duration round = so.timeout - lead;
  so.matchmaking_timeout = lead + std::min<Duration>(round / 2, 30s);
  so.data_timeout = lead + round / 2;
  auto begun = impl_->grads->begin(so);
  if (!begun) {
    log()->info("round {}: no early matchmaking: {}", key, begun.error().message());
    return;
  }
  // Another member's data arriving first tells the training thread to supply ours now.
  begun.value()->on_peer_data([weak = weak_from_this(), key] {
    auto self = weak.lock();
    if (!self) return;
    std::lock_guard lk(self->impl_->supplied_mu);
    self->impl_->supplied_key = key;
  });
  impl_->prepared = Impl::Prepared{key, *so.min_group_size, so.expected_group_size.value_or(0),
                                   impl_->grads, std::move(begun).value()};
  ++impl_->early.prepared;
  log()->debug("round {}: matchmaking begun {:.2f} s ahead, {} peers expected, group of >= {}", key,
               secs(lead), plan.options.expected_members, *so.min_group_size);
}

bool NetCollaboration::peers_supplied(const std::string& key) const {
  std::lock_guard lk(impl_->supplied_mu);
  return !key.empty() && impl_->supplied_key == key;
}

void NetCollaboration::cancel_prepared_round() {
  {
    std::lock_guard lk(impl_->supplied_mu);
    impl_->supplied_key.clear();
  }
  if (!impl_->prepared) return;
  auto p = std::move(*impl_->prepared);
  impl_->prepared.reset();
  ++impl_->early.cancelled;
  if (p.step->finished()) return;
  p.step->cancel();
  log()->debug("round {}: prepared round cancelled", p.key);
  if (p.averager == impl_->grads) impl_->cancelled = std::move(p.step);
}

void NetCollaboration::abandon_round(const std::string& key) {
  if (impl_->prepared && impl_->prepared->key == key) {
    log()->info("round {}: abandoned before its data (the peers moved on)", key);
    cancel_prepared_round();
  }
  // A running step is ended only while no group has formed: once it runs with a group, the
  // others count on this member and the round's own deadlines and fault tolerance end it
  // (ending it here would make both sides fail a round that could still succeed).
  if (impl_->running && impl_->running_key == key && !impl_->running->finished() &&
      !impl_->running->grouped()) {
    log()->info("round {}: abandoned (the peers moved on)", key);
    impl_->abandoned_key = key;
    impl_->running->cancel();
  }
}

awaitable<bool> NetCollaboration::wait_cancelled(TimePoint until) {
  auto self = shared_from_this();
  // PendingStep::cancel() ends matchmaking and a grouped step at once; the step is over as
  // soon as its Leave / Disband went out and its streams closed.
  if (auto c = impl_->cancelled; c && !c->finished() && !co_await c->wait(until)) co_return false;
  impl_->cancelled.reset();
  co_return true;
}

const EarlyStats& NetCollaboration::early_stats() const noexcept {
  return impl_->early;
}

std::string NetCollaboration::prepared_round() const {
  return impl_->prepared ? impl_->prepared->key : std::string();
}

bool NetCollaboration::prepared_round_grouped() const {
  return impl_->prepared && impl_->prepared->step->grouped();
}

// --- rounds -------------------------------------------------------------------------------

awaitable<result<training::RoundResult>> NetCollaboration::average(training::RoundData data,
                                                                   training::RoundOptions options) {
  auto self = shared_from_this();
  if (impl_->stopped) co_return make_error(errc::closed, "collaboration stopped");
  ST_CO_TRY(training::check_round_data(data));
  ST_CO_TRY(ensure_grads(data.layout, options.compression));
  auto avg = impl_->grads;
  // The round prepared for this key completes with these tensors (its group, with the
  // majority expected when it was prepared, may have formed already); anything else
  // prepared is stale.
  std::shared_ptr<averaging::PendingStep> step;
  const bool early = impl_->prepared && impl_->prepared->key == options.key &&
                     impl_->prepared->averager == avg && !impl_->prepared->step->finished();
  // The hint the step's matchmaking got (the prepared one for an early round), for the log.
  const std::size_t expected = early ? impl_->prepared->expected_group
                                     : step_options(options).expected_group_size.value_or(0);
  if (early) {
    step = std::move(impl_->prepared->step);
    impl_->prepared.reset();
    ++impl_->early.used;
  } else {
    cancel_prepared_round();
    if (!co_await wait_cancelled(options.deadline))
      co_return make_error(errc::unavailable, "round " + options.key +
                                                  ": a cancelled early step is still matchmaking");
    if (impl_->stopped || avg != impl_->grads)
      co_return make_error(errc::cancelled, "collaboration changed before the round");
    ST_CO_TRY(step, avg->begin(step_options(options)));
  }
  impl_->running = step;
  impl_->running_key = options.key;
  impl_->abandoned_key.clear();
  if (corrupt_gradient(cfg_.attack, data.input, options.key, *impl_, options.weight))
    data.input = impl_->attack_buf;
  // The averager reads the caller's input and writes the result into its output directly.
  // (A named StepData: GCC 12 destroys a braced temporary in a co_await expression twice.)
  averaging::StepData sd{data.input, data.output, data.owner};
  auto r = co_await step->run(options.weight, std::move(sd));
  if (impl_->running == step) impl_->running.reset();
  if (!r && r.error() == errc::cancelled && impl_->abandoned_key == options.key)
    co_return make_error(errc::unavailable,
                         "round " + options.key + " abandoned: the peers moved on");
  if (!r) co_return r.error();
  const auto& res = r.value();
  std::string note = early ? "group formed early" : "";
  if (expected > 0) note += fmt::format("{}all {} expected", note.empty() ? "" : ", ", expected);
  log()->info(
      "round {}: {} peers{}, matchmaking {:.2f} s, all-reduce {:.2f} s, {} bytes sent; data "
      "{:.1f} ms, others {:.1f} ms, exchange {:.1f} ms, close {:.1f} ms",
      options.key, res.group.members.size(), note.empty() ? "" : " (" + note + ")",
      secs(res.matchmaking_time), secs(res.allreduce_time), res.bytes_sent,
      1e3 * secs(res.data_wait), 1e3 * secs(res.peer_wait), 1e3 * secs(res.exchange_time),
      1e3 * secs(res.close_time));
  impl_->sent += res.bytes_sent;
  impl_->received += res.bytes_received;
  if (avg != impl_->grads || impl_->stopped)
    co_return make_error(errc::cancelled, "collaboration changed during the round");
  training::RoundResult out;
  for (std::size_t i = 0; i < res.contributions.size(); ++i) {
    // A member dropped before any of its values counted (it died or left right after the
    // group formed) is not part of the result: a round whose others all were dropped is this
    // peer alone (the optimizer then does not apply it as the collaboration's step).
    const auto& m = res.contributions[i];
    if (i != res.my_index && m.counted_elements == 0) continue;
    auto id = net::PeerId::from_bytes(m.peer.bytes());
    if (!id) continue;
    if (i != res.my_index) impl_->guard.vouch(id.value());  // a real peer of this run
    out.members.push_back({std::move(id).value(), m.weight});
    out.total_weight += m.weight;
  }
  out.bytes_sent = res.bytes_sent;
  out.bytes_received = res.bytes_received;
  out.matchmaking_time = res.matchmaking_time;
  out.allreduce_time = res.allreduce_time;
  out.early = early;
  for (auto& s : r.value().grad_samples) {
    auto id = net::PeerId::from_bytes(s.peer.bytes());
    if (!id) continue;
    training::ContributionSample t{std::move(id).value(), s.weight, s.median_weight, {}};
    for (auto& sl : s.slices) t.slices.push_back({sl.offset, std::move(sl.values)});
    out.grad_samples.push_back(std::move(t));
  }
  ++rounds_;
  co_return out;
}

}  // namespace starling::collab
