// RoundCore: construction, message validation and intake. The phase logic is in
// round_core_flow.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "compression_kernels.hpp"
#include "starling/averaging/round_core.hpp"
#include "starling/core/log.hpp"

namespace starling::averaging {

namespace {

// Tiles of detail::kTile values with a constant trip count: vectorised even at -O2.
constexpr std::size_t kT = detail::kTile;

// out = sum_j coeffs[j] * inputs[j], summed in j order for every value (one pass over out).
ST_KERNEL_CLONES void reduce_range(float* __restrict out, const float* const* in,
                                   const float* coeffs, std::size_t inputs, std::size_t n) {
  std::size_t i = 0;
  for (; i + kT <= n; i += kT) {
    float t[kT];
    const float c0 = coeffs[0];
    const float* __restrict a = in[0] + i;
    for (std::size_t k = 0; k < kT; ++k) t[k] = c0 * a[k];
    for (std::size_t j = 1; j < inputs; ++j) {
      const float c = coeffs[j];
      const float* __restrict b = in[j] + i;
      for (std::size_t k = 0; k < kT; ++k) t[k] += c * b[k];
    }
    std::memcpy(out + i, t, sizeof t);
  }
  for (; i < n; ++i) {
    float v = coeffs[0] * in[0][i];
    for (std::size_t j = 1; j < inputs; ++j) v += coeffs[j] * in[j][i];
    out[i] = v;
  }
}

// True when no value is NaN or infinite (exponent bits all ones).
ST_KERNEL_CLONES bool all_finite(const float* __restrict p, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 * kT <= n; i += 16 * kT) {
    std::uint32_t acc[kT] = {};
    for (std::size_t r = 0; r < 16; ++r) {
      std::uint32_t u[kT];
      std::memcpy(u, p + i + r * kT, sizeof u);
      // Exponent all ones: (e + 1 << 23) carries into the sign bit.
      for (std::size_t k = 0; k < kT; ++k) acc[k] |= (u[k] & 0x7f800000u) + 0x00800000u;
    }
    std::uint32_t any = 0;
    for (std::size_t k = 0; k < kT; ++k) any |= acc[k];
    if (any & 0x80000000u) return false;
  }
  for (; i < n; ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

}  // namespace

void run_reduce_job(const ReduceJob& job) {
  float* out = job.out.data();
  const std::size_t n = job.out.size();
  if (job.inputs.empty()) {
    std::fill(out, out + n, 0.0f);
    return;
  }
  if (job.aggregation.kind == Aggregation::centered_clip) {
    centered_clip(job.out, job.inputs, job.weights, job.aggregation);
    return;
  }
  std::vector<const float*> in;
  for (const auto& x : job.inputs) in.push_back(x.data());
  reduce_range(out, in.data(), job.coeffs.data(), in.size(), n);
}

RoundCore::RoundCore(std::vector<RoundMember> members, std::uint32_t self,
                     std::span<const float> local, std::span<float> output, RoundConfig cfg,
                     TimePoint now, TimePoint deadline)
    : members_(std::move(members)),
      self_(self),
      n_(static_cast<std::uint32_t>(members_.size())),
      local_(local),
      output_(output),
      cfg_(cfg),
      deadline_(deadline),
      failed_(members_.size()),
      blamed_(members_.size()),
      closed_(members_.size()),
      last_activity_(members_.size(), now),
      counted_elems_(members_.size(), 0) {
  for (const auto& m : members_) caps_.push_back(m.cap);
  sent_weight_.assign(members_.size(), std::numeric_limits<double>::quiet_NaN());
  local_pending_ = local_.empty() && !output_.empty();
  timings_.started = now;
}

std::string RoundCore::who(std::uint32_t m) const {
  return "member " + std::to_string(m);
}

result<void> RoundCore::start(TimePoint now) {
  if (n_ == 0 || n_ > kMaxGroupSize || self_ >= n_)
    return make_error(errc::invalid_argument, "all-reduce: bad group size or self index");
  if (!local_pending_ && local_.size() != output_.size())
    return make_error(errc::invalid_argument, "all-reduce: local and output sizes differ");
  if (cfg_.part_elems == 0) return make_error(errc::invalid_argument, "all-reduce: part size 0");
  ST_TRY(validate(cfg_.aggregation));
  for (std::uint32_t i = 0; i < n_; ++i) {
    const auto& m = members_[i];
    if (!std::isfinite(m.weight) || m.weight < 0)
      return make_error(errc::invalid_argument, "all-reduce: " + who(i) + " has a bad weight");
    if (m.cap.bandwidth == 0)
      return make_error(errc::invalid_argument, "all-reduce: " + who(i) + " has zero bandwidth");
  }
  std::vector<Segment> all{{0, output_.size()}};
  begin_subround(0, std::move(all), Bitset(n_, true), now);
  advance(now);
  return success();
}

result<void> RoundCore::provide_local(std::span<const float> local, double weight, TimePoint now) {
  if (!local_pending_)
    return make_error(errc::invalid_argument, "all-reduce: this member's data is already in");
  if (local.size() != output_.size())
    return make_error(errc::invalid_argument, "all-reduce: local and output sizes differ");
  if (!std::isfinite(weight) || weight < 0)
    return make_error(errc::invalid_argument, "all-reduce: weight must be finite and >= 0");
  local_ = local;
  members_[self_].weight = weight;
  local_pending_ = false;
  if (status_ != Status::running) return success();
  if (!sub_.plan.parts.empty()) send_parts();
  advance(now);
  return success();
}

bool RoundCore::retarget_output(std::span<float> output) {
  if (output_touched_ || output.size() != output_.size()) return false;
  output_ = output;
  return true;
}

void RoundCore::abandon(Error e) {
  fail(std::move(e));
}

double RoundCore::weight_of(std::uint32_t m) const {
  if (m >= n_) return 0;
  if (m != self_ && !std::isnan(sent_weight_[m])) return sent_weight_[m];
  return members_[m].weight;
}

void RoundCore::on_activity(std::uint32_t from, TimePoint now) {
  if (from < n_) last_activity_[from] = std::max(last_activity_[from], now);
}

void RoundCore::on_peer_failed(std::uint32_t peer, const std::string& reason, TimePoint now,
                               bool blame) {
  if (status_ != Status::running || peer >= n_ || peer == self_ || failed_.test(peer)) return;
  mark_failed(peer, reason, blame);
  advance(now);
}

void RoundCore::on_peer_closed(std::uint32_t peer, TimePoint now) {
  if (status_ != Status::running || peer >= n_ || peer == self_ || failed_.test(peer)) return;
  closed_.set(peer);
  advance(now);
}

void RoundCore::mark_failed(std::uint32_t peer, const std::string& reason, bool blame) {
  if (failed_.test(peer)) return;
  failed_.set(peer);
  if (blame) blamed_.set(peer);
  logger("averaging")
      ->info("all-reduce [member {}]: {} failed in sub-round {} ({}): {}", self_, who(peer),
             sub_.index, phase(), reason);
}

void RoundCore::fail(Error e) {
  if (status_ != Status::running) return;
  status_ = Status::failed;
  error_ = std::move(e);
  jobs_.clear();
  future_.clear();
  ahead_.clear();
  held_bytes_ = 0;
  logger("averaging")->warn("all-reduce [member {}] failed: {}", self_, error_.message());
}

void RoundCore::send(std::uint32_t to, RoundMessage m) {
  outbox_.push_back({to, std::move(m)});
}

std::vector<Envelope> RoundCore::take_outbox() {
  return std::exchange(outbox_, {});
}

std::vector<ReduceJob> RoundCore::take_reduce_jobs() {
  return std::exchange(jobs_, {});
}

result<void> RoundCore::on_message(std::uint32_t from, const RoundMessage& msg, TimePoint now,
                                   FloatBuffer* owned) {
  if (from >= n_ || from == self_)
    return make_error(errc::invalid_argument, "all-reduce: message from unknown member");
  if (status_ != Status::running || failed_.test(from)) return success();  // fenced or over
  on_activity(from, now);
  owned_ = owned;
  auto r = handle(from, msg, now);
  owned_ = nullptr;
  if (!r) {
    logger("averaging")
        ->warn("all-reduce [member {}]: excluding {}: {}", self_, who(from), r.error().message());
    mark_failed(from, r.error().message(), true);
  }
  advance(now);
  return r;
}

result<void> RoundCore::handle(std::uint32_t from, const RoundMessage& msg, TimePoint now) {
  const std::uint32_t sr = std::visit([](const auto& m) { return m.subround; }, msg);
  if (sr < sub_.index) return success();  // stale: that sub-round is decided
  if (sr > sub_.index + 1)
    return make_error(errc::protocol_violation, "message for sub-round " + std::to_string(sr) +
                                                    " while in " + std::to_string(sub_.index));
  if (sr == sub_.index + 1) return buffer_future(from, msg);
  return std::visit(
      [&](const auto& m) -> result<void> {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, PartMsg>) return handle_part(from, m);
        if constexpr (std::is_same_v<T, ResultMsg>) return handle_result(from, m);
        if constexpr (std::is_same_v<T, FinMsg>) return handle_fin(from, m);
      },
      msg);
}

result<void> RoundCore::check_floats(std::span<const float> d, std::uint64_t want,
                                     const char* what) const {
  if (d.size() != want)
    return make_error(errc::invalid_argument, std::string(what) + " has " +
                                                  std::to_string(d.size()) + " values, expected " +
                                                  std::to_string(want));
  if (cfg_.reject_non_finite && !all_finite(d.data(), d.size()))
    return make_error(errc::invalid_argument, std::string(what) + " holds NaN or infinity");
  return success();
}

std::uint32_t RoundCore::my_part_index(std::uint32_t part) const {
  auto it = std::lower_bound(sub_.my_parts.begin(), sub_.my_parts.end(), part);
  return static_cast<std::uint32_t>(it - sub_.my_parts.begin());
}

result<void> RoundCore::handle_part(std::uint32_t from, const PartMsg& m) {
  const auto& parts = sub_.plan.parts;
  if (m.part >= parts.size())
    return make_error(errc::protocol_violation, "part " + std::to_string(m.part) + " out of range");
  const PartSpec& spec = parts[m.part];
  if (spec.owner != self_)
    return make_error(errc::protocol_violation,
                      "part " + std::to_string(m.part) + " sent to a member that does not own it");
  if (!sub_.alive.test(from))
    return make_error(errc::protocol_violation, "part from a member excluded by the group");
  const std::uint32_t i = my_part_index(m.part);
  // A part is reduced only once every sender not seen failed delivered it: anything later
  // from a live sender is a repeat.
  if (sub_.have[i].test(from) || sub_.requested[i])
    return make_error(errc::protocol_violation, "duplicate part");
  if (!std::isfinite(m.weight) || m.weight < 0)
    return make_error(errc::protocol_violation, "part with a bad weight");
  if (!std::isnan(sent_weight_[from]) && sent_weight_[from] != m.weight)
    return make_error(errc::protocol_violation, "parts with different weights");
  ST_TRY(check_floats(m.data, spec.size(), "part"));
  sent_weight_[from] = m.weight;
  auto& slot = sub_.slots[i][from];
  if (owned_ && owned_->data() == m.data.data() && owned_->size() == m.data.size())
    slot = std::move(*owned_);  // the driver's receive buffer: no copy
  else
    slot.assign(m.data.begin(), m.data.end());
  sub_.have[i].set(from);
  if (sub_.owed[from] == 0) return make_error(errc::internal, "owed count underflow");
  --sub_.owed[from];
  return success();
}

result<void> RoundCore::handle_result(std::uint32_t from, const ResultMsg& m) {
  const auto& parts = sub_.plan.parts;
  if (m.part >= parts.size())
    return make_error(errc::protocol_violation,
                      "result " + std::to_string(m.part) + " out of range");
  const PartSpec& spec = parts[m.part];
  if (spec.owner != from)
    return make_error(errc::protocol_violation, "result for a part the sender does not own");
  if (m.counted.size() != n_) return make_error(errc::invalid_argument, "result tag size");
  if (sub_.got.test(m.part)) return make_error(errc::protocol_violation, "duplicate result");
  ST_TRY(check_floats(m.data, spec.size(), "result"));
  output_touched_ = true;
  float* dst = output_.data() + spec.begin;
  if (m.data.data() != dst)  // else the driver received it in place (result_destination())
    std::copy(m.data.begin(), m.data.end(), dst);
  sub_.got.set(m.part);
  sub_.part_counted[m.part] = m.counted;
  return success();
}

std::span<float> RoundCore::result_destination(std::uint32_t from, std::uint32_t subround,
                                               std::uint32_t part, std::size_t count) const {
  if (status_ != Status::running || from >= n_ || failed_.test(from) || subround != sub_.index)
    return {};
  const auto& parts = sub_.plan.parts;
  if (part >= parts.size() || parts[part].owner != from || parts[part].owner == self_ ||
      sub_.got.test(part) || parts[part].size() != count)
    return {};
  output_touched_ = true;
  return output_.subspan(parts[part].begin, parts[part].size());
}

result<void> RoundCore::check_report(const FinReport& r) const {
  if (r.member >= n_) return make_error(errc::invalid_argument, "fin report for unknown member");
  if (r.missing.size() != sub_.plan.parts.size() || r.failed.size() != n_ ||
      r.blamed.size() != n_ || r.counted.size() != n_)
    return make_error(errc::invalid_argument, "fin report bitset sizes");
  Bitset extra = r.blamed;
  extra &= ~r.failed;
  if (!extra.none()) return make_error(errc::protocol_violation, "fin blames a member not failed");
  // A member reports a part missing only when it saw the part's owner fail.
  for (auto p : r.missing.indices())
    if (!r.failed.test(sub_.plan.parts[p].owner))
      return make_error(errc::protocol_violation, "fin reports a part missing but not its owner");
  return success();
}

result<void> RoundCore::handle_fin(std::uint32_t from, const FinMsg& m) {
  if (m.reports.size() > n_) return make_error(errc::too_large, "fin with too many reports");
  for (const auto& r : m.reports) ST_TRY(check_report(r));
  if (m.stage == 1) {
    if (members_[self_].cap.client)
      return make_error(errc::protocol_violation, "fin1 sent to a client");
    if (!sub_.alive.test(from)) return make_error(errc::protocol_violation, "fin1 from excluded");
    if (m.reports.size() != 1 || m.reports[0].member != from)
      return make_error(errc::protocol_violation, "fin1 must carry the sender's own report");
    if (sub_.fin1[from]) return make_error(errc::protocol_violation, "duplicate fin1");
    sub_.fin1[from] = m.reports[0];
    return success();
  }
  if (m.stage == 2) {
    if (members_[from].cap.client)
      return make_error(errc::protocol_violation, "fin2 from a client");
    if (sub_.fin2[from]) return make_error(errc::protocol_violation, "duplicate fin2");
    Bitset seen(n_);
    for (const auto& r : m.reports) {
      if (seen.test(r.member)) return make_error(errc::protocol_violation, "fin2 repeats a member");
      seen.set(r.member);
    }
    sub_.fin2[from] = m.reports;
    return success();
  }
  return make_error(errc::invalid_argument, "fin stage " + std::to_string(m.stage));
}

std::span<float> RoundCore::part_output(std::uint32_t part) const {
  const auto& p = sub_.plan.parts.at(part);
  return output_.subspan(p.begin, p.size());
}

}  // namespace starling::averaging
