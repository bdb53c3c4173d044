// RoundRunner: accountability (round_acct.hpp, docs/security.md). The commitment goes out
// before this member's first part of each sub-round; receipts are checked where PART and
// RESULT frames are decoded; after the all-gather every member sends its reveal and relays,
// then its projection reports, and runs the aggregation check. Hashing and projections run
// on the pool.
#include <cmath>

#include "round_runner.hpp"
#include "starling/core/log.hpp"
#include "starling/core/thread_pool.hpp"

namespace starling::averaging::detail {

namespace {

Error acct_error(const std::string& why) {
  return make_error(errc::protocol_violation, "accountability: " + why);
}

// Pool tasks as plain function objects (GCC 12 mishandles lambdas nested in coroutines).
struct CommitOut {
  std::vector<acct::Hash32> hashes;
  std::vector<std::pair<std::uint32_t, std::vector<float>>> tampered;  // (part, values sent)
};
// Hashes this member's values of every part of a sub-round; test-only different-parts: the
// parts owned by `victim` get other values (n: nobody).
struct CommitTask {
  std::shared_ptr<PoolGate> gate;
  std::vector<PartSpec> parts;
  std::span<const float> local;
  std::uint32_t victim;
  result<CommitOut> operator()() const {
    PoolGate::Pass pass(gate.get());
    if (!pass.ok) return make_error(errc::cancelled, "all-reduce: the round ended");
    CommitOut out;
    for (std::uint32_t p = 0; p < parts.size(); ++p) {
      const auto v = local.subspan(parts[p].begin, parts[p].size());
      out.hashes.push_back(acct::hash_floats(v));
      if (parts[p].owner != victim) continue;
      std::vector<float> t(v.begin(), v.end());
      for (auto& x : t) x = -1000.0f * x - 1.0f;
      out.tampered.emplace_back(p, std::move(t));
    }
    return out;
  }
};
struct PartCheckTask {
  const Bytes* receipt;
  acct::Hash32 round;
  std::uint32_t sub, part, from;
  acct::PubKey key;
  std::span<const float> data;
  result<acct::DataReceipt> operator()() const {
    ST_TRY(auto r, acct::decode_receipt(*receipt));
    ST_TRY(acct::check_part(r, round, sub, part, from, key, data));
    return r;
  }
};
struct ResultChecked {
  acct::DataReceipt receipt;
  double norm = 0;
};
struct ResultCheckTask {
  std::shared_ptr<PoolGate> gate;  // the values may be in the round's output
  const Bytes* receipt;
  std::span<const float> data;
  result<ResultChecked> operator()() const {
    PoolGate::Pass pass(gate.get());
    if (!pass.ok) return make_error(errc::cancelled, "all-reduce: the round ended");
    ST_TRY(auto r, acct::decode_receipt(*receipt));
    if (acct::hash_floats(data) != r.data_hash)
      return acct_error("result receipt: hash does not match the data");
    double s = 0;
    for (float x : data) s += static_cast<double>(x) * x;
    return ResultChecked{std::move(r), std::sqrt(s)};
  }
};
struct ProjectTask {
  std::shared_ptr<PoolGate> gate;
  acct::Hash32 seed;
  const std::vector<SettledPart>* parts;
  std::span<const float> local, output;
  result<std::vector<acct::Projection>> operator()() const {
    PoolGate::Pass pass(gate.get());
    if (!pass.ok) return make_error(errc::cancelled, "all-reduce: the round ended");
    std::vector<acct::Projection> out;
    for (const auto& p : *parts)
      out.push_back(acct::project(seed, p.subround, p.part,
                                  local.subspan(p.range.begin, p.range.size()),
                                  output.subspan(p.range.begin, p.range.size())));
    return out;
  }
};

// An owner whose part failed the check: the false_report candidates that verify (a member
// lied in its report).
struct AnswerTask {
  std::vector<acct::Evidence> candidates;
  acct::CheckConfig check;
  result<std::vector<acct::Evidence>> operator()() const {
    std::vector<acct::Evidence> out;
    for (const auto& e : candidates)
      if (acct::verify_evidence(e, check)) out.push_back(e);
    return out;
  }
};

}  // namespace

result<void> RoundRunner::acct_init() {
  if (!cfg_.acct) return success();
  if (compressed())
    return make_error(errc::invalid_argument,
                      "accountability: needs uncompressed parts (codec none); lossy codecs are "
                      "not covered yet");
  acct::RoundInfo info;
  info.context = cfg_.acct->context;
  info.context.insert(info.context.end(), group_.group_id.begin(), group_.group_id.end());
  for (const auto& p : peers_) {
    auto k = acct::key_of_peer(p);
    if (!k) return make_error(errc::invalid_argument, "accountability: needs Ed25519 peer ids");
    info.members.push_back(*k);
  }
  if (info.members[self_] != acct::key_of(cfg_.acct->key))
    return make_error(errc::invalid_argument,
                      "accountability: the signing key is not this member's identity");
  acct_ = std::make_unique<RoundAcct>(cfg_.acct, std::move(info), self_);
  return success();
}

bool RoundRunner::reachable(std::uint32_t j) const {
  return j != self_ && !(group_.members[self_].client && group_.members[j].client);
}

void RoundRunner::send_acct(std::uint32_t j, std::shared_ptr<const Bytes> statement) {
  auto& P = p_[j];
  if (P.fenced) return;
  OutFrame f;
  f.acct = std::move(statement);
  P.queue.push_back(std::move(f));
  P.wake->set();
}

// The core's messages go to the writers, except that with accountability a sub-round's parts
// (and everything after them) wait until its commitment is out.
void RoundRunner::route(Envelope env) {
  if (acct_) {
    const auto* pm = std::get_if<PartMsg>(&env.msg);
    if (committing_ || (pm && !acct_->committed(pm->subround))) {
      if (!committing_ && !scope_.closed()) {
        committing_ = true;
        ++pool_tasks_;
        scope_.spawn(commit_sub(pm->subround, pm->weight));
      }
      held_.push_back(std::move(env));
      return;
    }
  }
  auto& P = p_[env.to];
  if (P.fenced) return;
  P.queue.push_back({std::move(env.msg)});
  P.wake->set();
}

awaitable<void> RoundRunner::commit_sub(std::uint32_t sub, double weight) {
  auto self = shared_from_this();
  PoolUse use(this, true);  // counted by route()
  const std::uint32_t victim =
      cfg_.acct->attack == RoundAttack::different_parts ? (self_ + 1) % n_ : n_;
  CommitTask task{gate_, core_.plan().parts, local_, victim};
  auto out = co_await pool_.run(std::move(task));
  committing_ = false;
  if (!out) {
    logger("averaging")->warn("accountability: cannot commit: {}", out.error().message());
    held_.clear();
    abandon(out.error());
    co_return;
  }
  auto c = std::make_shared<const Bytes>(acct_->commit(sub, weight, std::move(out.value().hashes)));
  for (auto& t : out.value().tampered) acct_->set_tampered(sub, t.first, std::move(t.second));
  for (std::uint32_t j = 0; j < n_; ++j)
    if (reachable(j)) send_acct(j, c);
  std::deque<Envelope> held;
  held.swap(held_);
  for (auto& e : held) route(std::move(e));
  pump();
}

awaitable<result<void>> RoundRunner::acct_check(std::uint32_t j, const RoundMessage& msg,
                                                const Bytes& receipt) {
  if (receipt.empty()) co_return acct_error("part or result without its receipt");
  if (const auto* p = std::get_if<PartMsg>(&msg)) {
    PartCheckTask task{&receipt, acct_->round(),           p->subround, p->part,
                       j,        acct_->info().members[j], p->data};
    auto r = co_await pool_.run(task);
    if (!r) co_return r.error();
    co_return acct_->on_part(j, r.value());
  }
  const auto& m = std::get<ResultMsg>(msg);
  ResultCheckTask task{gate_, &receipt, m.data};
  PoolUse use(this);
  auto r = co_await pool_.run(task);
  if (!r) co_return r.error();
  co_return acct_->on_result(j, m, r.value().receipt, r.value().norm, m.data);
}

bool RoundRunner::gone(std::uint32_t j) const {
  const auto& P = p_[j];
  return P.fenced || P.lost || P.ended >= expected_streams(j);
}

bool RoundRunner::acct_ready(AcctWait w, const std::vector<SettledPart>& settled) const {
  switch (w) {
    case AcctWait::reveals:
      return acct_->have_reveals();
    case AcctWait::reports:
      return acct_->missing_reports(settled).empty();
    case AcctWait::checked:
      for (std::uint32_t j = 0; j < n_; ++j)
        if (reachable(j) && !gone(j) && !acct_->checked_by(j)) return false;
      return true;
    case AcctWait::answered:
      for (auto j : acct_->accused_owners())
        if (reachable(j) && !gone(j) && !acct_->answered_by(j)) return false;
      return true;
  }
  return true;
}

awaitable<void> RoundRunner::acct_wait(TimePoint until, AcctWait w,
                                       const std::vector<SettledPart>& settled) {
  for (;;) {
    if (acct_ready(w, settled) || Clock::now() >= until) co_return;
    acct_event_.reset();
    (void)co_await with_timeout(acct_event_.wait(), until - Clock::now(), "accountability");
  }
}

void RoundRunner::send_evidence(std::uint32_t j, const acct::Evidence& e) {
  for (auto& p : RoundAcct::pieces(e)) send_acct(j, std::make_shared<const Bytes>(std::move(p)));
}

// After the check: accusations to the accused owners, then the checked marker; once every
// member has checked, this member answers the accusations of its parts it can refute, then
// sends the answered marker; once every owner it accused has answered (or gone, or the
// deadline passed), the unanswered accusations become evidence. Each wait is bounded by
// stall_timeout.
awaitable<void> RoundRunner::acct_answers() {
  auto self = shared_from_this();
  auto log = logger("averaging");
  const TimePoint until = Clock::now() + cfg_.round.stall_timeout;
  for (auto& [owner, e] : acct_->accusations())
    if (reachable(owner)) send_evidence(owner, e);
  auto checked = std::make_shared<const Bytes>(RoundAcct::checked_marker());
  for (std::uint32_t j = 0; j < n_; ++j)
    if (reachable(j)) send_acct(j, checked);
  co_await acct_wait(until, AcctWait::checked, {});
  if (!acct_ready(AcctWait::checked, {}))
    log->warn("accountability: member {}: not every member said it checked", self_);
  auto candidates = acct_->answer_candidates(output_);
  if (!candidates.empty()) {
    AnswerTask answer{std::move(candidates), cfg_.acct->check};
    PoolUse answering(this);
    auto found = co_await pool_.run(std::move(answer));
    if (found) {
      for (auto& e : found.value()) {
        const auto pieces = RoundAcct::pieces(e);
        for (std::uint32_t j = 0; j < n_; ++j)
          if (reachable(j))
            for (const auto& p : pieces) send_acct(j, std::make_shared<const Bytes>(p));
        acct_->answer(std::move(e));
      }
    }
    if (!found || found.value().empty())
      log->warn("accountability: member {}: its part is accused, no report about it lies", self_);
  }
  auto answered = std::make_shared<const Bytes>(RoundAcct::answered_marker());
  for (std::uint32_t j = 0; j < n_; ++j)
    if (reachable(j)) send_acct(j, answered);
  // Its own deadline: a member that withholds its checked marker delays every answer until
  // the first one.
  co_await acct_wait(Clock::now() + cfg_.round.stall_timeout, AcctWait::answered, {});
  if (auto left = acct_->accused_owners(); !left.empty())
    log->warn("accountability: member {}: {} accused owner(s) did not answer", self_, left.size());
  acct_->conclude();
}

awaitable<void> RoundRunner::acct_phase() {
  auto self = shared_from_this();
  if (!acct_ || core_.status() != RoundCore::Status::done) co_return;
  auto log = logger("averaging");
  std::size_t clients = 0;
  for (const auto& m : group_.members) clients += m.client ? 1 : 0;
  if (clients >= 2 || core_.failed().count() > 0) {
    log->info("accountability: member {}: round not checked ({})", self_,
              clients >= 2 ? "two clients cannot exchange reveals" : "a member failed");
    co_return;
  }
  std::vector<SettledPart> settled, mine;
  for (const auto& c : core_.coverage()) {
    settled.push_back({c.subround, c.part, c.owner, c.range, c.counted});
    if (c.owner == self_) (void)acct_->result_receipt(c.subround, c.part, c.counted);
    if (c.counted.test(self_)) mine.push_back(settled.back());
  }
  acct_->settle(settled);
  auto rev = std::make_shared<const Bytes>(acct_->reveal());
  for (std::uint32_t j = 0; j < n_; ++j) {
    if (!reachable(j)) continue;
    send_acct(j, rev);
    for (auto& b : acct_->relays(j)) send_acct(j, std::make_shared<const Bytes>(std::move(b)));
  }
  const TimePoint until = Clock::now() + cfg_.round.stall_timeout;
  co_await acct_wait(until, AcctWait::reveals, settled);
  if (!acct_->have_reveals()) {
    log->warn("accountability: member {}: round not checked, no reveal from {} member(s)", self_,
              acct_->missing_reveals().size());
    co_await acct_answers();  // others may still accuse this owner: it answers with their reveals
    co_return;
  }
  ProjectTask task{gate_, acct_->seed(), &mine, local_, output_};
  PoolUse use(this);
  auto pj = co_await pool_.run(task);
  if (!pj) {
    log->warn("accountability: cannot project: {}", pj.error().message());
    co_await acct_answers();
    co_return;
  }
  const double w = core_.weight_of(self_);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    auto b = acct_->report(mine[i], w, pj.value()[i]);
    if (b.empty()) continue;
    auto shared = std::make_shared<const Bytes>(std::move(b));
    // Test-only false-report: the lie goes to everyone but the owner it frames, which learns
    // it only from the accusations.
    const bool hide = cfg_.acct->attack == RoundAttack::false_report && mine[i].owner != self_;
    for (std::uint32_t j = 0; j < n_; ++j)
      if (reachable(j) && !(hide && j == mine[i].owner)) send_acct(j, shared);
  }
  co_await acct_wait(until, AcctWait::reports, settled);
  if (auto miss = acct_->missing_reports(settled); !miss.empty())
    log->warn("accountability: member {}: reports missing from {} member(s)", self_, miss.size());
  const std::size_t checked = acct_->check(settled);
  collect_grad_samples(settled);
  co_await acct_answers();
  log->debug(
      "accountability: member {} checked {} of {} parts after {} ms", self_, checked,
      settled.size(),
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started_).count());
  checked_parts_ = checked;
}

}  // namespace starling::averaging::detail
