// Member-side checks, the aggregation check (random projection of the fixed point) and the
// verification of evidence (accountability.hpp).
#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "averaging/acct_codec.hpp"
#include "starling/averaging/accountability.hpp"
#include "starling/averaging/robust.hpp"

namespace starling::averaging::acct {

namespace {

Error bad(const std::string& why) {
  return make_error(errc::invalid_argument, why);
}

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint64_t stream_seed(const Hash32& seed, std::uint32_t subround, std::uint32_t part) {
  Writer w;
  w.fixed(seed);
  w.u32(subround);
  w.u32(part);
  std::uint8_t h[8];
  crypto_generichash(h, sizeof h, w.out.data(), w.out.size(), nullptr, 0);
  std::uint64_t s = 0;
  for (int i = 0; i < 8; ++i) s |= std::uint64_t{h[i]} << (8 * i);
  return s;
}

double norm(std::span<const float> v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

double norm_diff(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (std::size_t j = 0; j < a.size() && j < b.size(); ++j) {
    const double d = static_cast<double>(a[j]) - b[j];
    s += d * d;
  }
  return std::sqrt(s);
}

// The median the check uses for an adaptive radius: the upper one (d[n / 2]); 0 if empty.
double check_median(std::vector<double> d) {
  if (d.empty()) return 0;
  std::nth_element(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(d.size() / 2), d.end());
  return d[d.size() / 2];
}

bool near(double a, double b, double rel, double scale) {
  return std::abs(a - b) <= rel * std::max({std::abs(a), std::abs(b), scale, 1e-30});
}

// The signer of `s` must be member `index` of `info`.
template <class T>
result<void> member_signed(const T& s, const RoundInfo& info, const Hash32& round,
                           std::uint32_t index, const char* what) {
  if (s.round != round) return bad(std::string(what) + ": another round");
  if (index >= info.members.size() || info.members[index] != s.key)
    return bad(std::string(what) + ": signer is not that member");
  if (!verify_sig(s)) return bad(std::string(what) + ": bad signature");
  return success();
}

// The seed from every member's reveal, in member order.
result<Hash32> seed_from(const Evidence& e, const Hash32& round) {
  if (e.reveals.size() != e.info.members.size()) return bad("evidence: not every member's reveal");
  std::vector<Hash32> nonces;
  for (std::uint32_t i = 0; i < e.reveals.size(); ++i) {
    const auto& r = e.reveals[i];
    if (r.member != i) return bad("evidence: reveals out of order");
    ST_TRY(member_signed(r, e.info, round, i, "reveal"));
    nonces.push_back(r.nonce);
  }
  return round_seed(round, nonces);
}

result<Verdict> verify_wrong_average(const Evidence& e, const CheckConfig& cfg) {
  if (e.receipts.size() != 1) return bad("wrong_average: needs the result");
  const auto& res = e.receipts[0];
  const Hash32 round = round_id(e.info);
  if (res.kind != DataKind::result) return bad("wrong_average: not a result");
  ST_TRY(member_signed(res, e.info, round, res.signer, "result"));
  ST_TRY(auto seed, seed_from(e, round));
  if (e.reports.size() != res.counted.size() || res.counted.empty())
    return bad("wrong_average: not one report per counted member");
  for (std::size_t i = 0; i < e.reports.size(); ++i) {
    const auto& rp = e.reports[i];
    if (rp.member != res.counted[i]) return bad("wrong_average: reports out of order");
    ST_TRY(member_signed(rp, e.info, round, rp.member, "report"));
    if (rp.subround != res.subround || rp.part != res.part || rp.result_hash != res.data_hash ||
        rp.seed != seed)
      return bad("wrong_average: a report is about something else");
  }
  const auto fp = check_fixed_point(e.reports, res.clip, res.tau, res.norm, cfg);
  if (fp.ok()) return bad("wrong_average: the result satisfies the fixed-point check");
  return Verdict{res.key, e.kind, round, res.subround, res.part, true};
}

result<Verdict> verify_false_report(const Evidence& e, const CheckConfig& cfg) {
  if (e.receipts.size() != 2 || e.reports.size() != 1)
    return bad("false_report: needs the part, the result and the report");
  const auto& part = e.receipts[0];
  const auto& res = e.receipts[1];
  const auto& rp = e.reports[0];
  const Hash32 round = round_id(e.info);
  if (part.kind != DataKind::part || res.kind != DataKind::result)
    return bad("false_report: wrong receipt kinds");
  ST_TRY(member_signed(part, e.info, round, part.signer, "part"));
  ST_TRY(member_signed(res, e.info, round, res.signer, "result"));
  ST_TRY(member_signed(rp, e.info, round, rp.member, "report"));
  ST_TRY(auto seed, seed_from(e, round));
  if (rp.member != part.signer || part.subround != res.subround || part.part != res.part ||
      rp.subround != res.subround || rp.part != res.part || rp.result_hash != res.data_hash ||
      rp.seed != seed)
    return bad("false_report: statements about different things");
  if (e.data.size() != e.data2.size()) return bad("false_report: sizes differ");
  if (hash_floats(e.data) != part.data_hash) return bad("false_report: part values do not match");
  if (hash_floats(e.data2) != res.data_hash) return bad("false_report: result does not match");
  const Projection p = project(seed, res.subround, res.part, e.data, e.data2);
  const bool lied = rp.weight != part.weight || !near(rp.dist, p.dist, cfg.report_tol, 0) ||
                    !near(rp.proj, p.proj, cfg.report_tol, p.dist);
  if (!lied) return bad("false_report: the report matches the values");
  return Verdict{rp.key, e.kind, round, res.subround, res.part, false};
}

}  // namespace

result<void> check_commitment(const Commitment& c, const Hash32& round, std::uint32_t subround,
                              std::uint32_t sender, const PubKey& key) {
  if (c.round != round) return bad("commitment for another round (replayed?)");
  if (c.subround != subround) return bad("commitment for another sub-round");
  if (c.sender != sender || c.key != key) return bad("commitment from another member");
  if (!verify_sig(c)) return bad("commitment: bad signature");
  return success();
}

result<void> check_part(const DataReceipt& r, const Hash32& round, std::uint32_t subround,
                        std::uint32_t part, std::uint32_t sender, const PubKey& key,
                        std::span<const float> data) {
  if (r.kind != DataKind::part) return bad("part receipt: wrong kind");
  if (r.round != round) return bad("part receipt for another round (replayed?)");
  if (r.subround != subround || r.part != part) return bad("part receipt for another part");
  if (r.signer != sender || r.key != key) return bad("part receipt from another member");
  if (!verify_sig(r)) return bad("part receipt: bad signature");
  if (hash_floats(data) != r.data_hash) return bad("part receipt: hash does not match the data");
  return success();
}

bool contradicts(const Commitment& c, const DataReceipt& p) {
  return p.kind == DataKind::part && c.key == p.key && c.round == p.round &&
         c.subround == p.subround && c.sender == p.signer &&
         (p.part >= c.parts.size() || c.parts[p.part] != p.data_hash || c.weight != p.weight);
}

void projection_vector(const Hash32& seed, std::uint32_t subround, std::uint32_t part,
                       std::span<float> z) {
  std::uint64_t s = stream_seed(seed, subround, part);
  std::uint64_t bits = 0;
  for (std::size_t j = 0; j < z.size(); ++j) {
    if (j % 64 == 0) bits = splitmix(s);
    z[j] = ((bits >> (j % 64)) & 1u) != 0 ? 1.0f : -1.0f;
  }
}

Projection project(const Hash32& seed, std::uint32_t subround, std::uint32_t part,
                   std::span<const float> g, std::span<const float> r) {
  // Tiles of 64 values share one random word; four accumulators each, no branches (the sums
  // differ from a serial sum only by rounding, far inside CheckConfig::report_tol).
  std::uint64_t s = stream_seed(seed, subround, part);
  const std::size_t n = std::min(g.size(), r.size());
  double pa[4] = {0, 0, 0, 0}, da[4] = {0, 0, 0, 0};
  for (std::size_t b = 0; b < n; b += 64) {
    const std::uint64_t bits = splitmix(s);
    const std::size_t m = std::min<std::size_t>(64, n - b);
    for (std::size_t j = 0; j < m; ++j) {
      const double d = static_cast<double>(g[b + j]) - r[b + j];
      const double z = static_cast<double>(static_cast<int>((bits >> j) & 1u) * 2 - 1);
      pa[j % 4] += z * d;
      da[j % 4] += d * d;
    }
  }
  Projection p;
  p.proj = (pa[0] + pa[1]) + (pa[2] + pa[3]);
  p.dist = std::sqrt((da[0] + da[1]) + (da[2] + da[3]));
  return p;
}

FixedPointCheck check_fixed_point(std::span<const ProjectionReport> reports, bool clip, double tau,
                                  double result_norm, const CheckConfig& cfg) {
  FixedPointCheck out;
  out.bound = cfg.sigmas * (cfg.rel_tol * result_norm + cfg.abs_tol);
  std::vector<double> w;
  for (const auto& r : reports) w.push_back(r.weight);
  const double cut = clip ? cfg.cut : 0.0;
  if (clip) {
    w = cap_weights(w, cfg.max_weight_ratio);
    if (cfg.fixed_tau > 0) {
      out.tau_ok = near(tau, cfg.fixed_tau, 1e-12, 0);
    } else {
      std::vector<double> d;
      for (const auto& r : reports) d.push_back(r.dist);
      out.tau_ok = tau >= cfg.tau_slack * cfg.tau_scale * check_median(std::move(d));
    }
  }
  double total = 0;
  for (double x : w) total += x;
  if (!(total > 0)) w.assign(w.size(), 1.0);
  double sum = 0, wsum = 0;
  std::size_t counted = 0;
  for (std::size_t i = 0; i < reports.size(); ++i) {
    const double c = clip ? clip_coef(reports[i].dist, tau, cut) : 1.0;
    counted += c > 0;
    sum += w[i] * c * reports[i].proj;
    wsum += w[i] * c;
  }
  // A cut may leave out a minority only (an honest adaptive radius cannot leave out more:
  // AggregationConfig::cut); a radius that leaves out more is implausible.
  if (cut > 0 && 2 * counted <= reports.size()) out.tau_ok = false;
  if (wsum > 0) {
    out.statistic = sum / wsum;
  } else {
    out.statistic = std::numeric_limits<double>::infinity();  // nobody counts: not a fixed point
  }
  return out;
}

double fixed_point_residual(std::span<const float> result,
                            const std::vector<std::span<const float>>& inputs,
                            std::span<const double> weights, bool clip, double tau,
                            double max_weight_ratio, double cut) {
  std::vector<double> w(weights.begin(), weights.end());
  if (clip) w = cap_weights(w, max_weight_ratio);
  double total = 0;
  for (double x : w) total += x;
  if (!(total > 0)) w.assign(inputs.size(), 1.0);
  std::vector<double> acc(result.size(), 0.0);
  double wsum = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const double c = clip ? clip_coef(norm_diff(inputs[i], result), tau, cut) : 1.0;
    if (w[i] * c == 0) continue;
    wsum += w[i] * c;
    for (std::size_t j = 0; j < result.size(); ++j)
      acc[j] += w[i] * c * (static_cast<double>(inputs[i][j]) - result[j]);
  }
  if (!(wsum > 0)) return std::numeric_limits<double>::infinity();
  double s = 0;
  for (double x : acc) s += x * x;
  return std::sqrt(s) / wsum;
}

CheckedClip centered_clip_checked(std::span<float> out,
                                  const std::vector<std::span<const float>>& inputs,
                                  std::span<const double> weights, AggregationConfig cfg,
                                  const CheckConfig& check, std::uint32_t max_iterations_cap) {
  CheckedClip r;
  const bool adaptive = !(cfg.tau > 0);
  const double cut = effective_cut(cfg);
  double tau = cfg.tau;  // <= 0: adaptive, from the distances to the coordinate-wise median
  // An adaptive radius comes from the distances to the coordinate-wise median, but members
  // check it against the distances to the result (tau >= tau_slack x tau_scale x their
  // median). With clustered values (a tight honest group, far attackers, members with
  // nothing to send) the two medians can differ by more than the slack: the owner then clips
  // again with tau_scale x the median distance to its result, until the radius it declares
  // holds (at most kRetries times). The cut stays the adaptive radius's.
  constexpr int kRetries = 4;
  for (int attempt = 0;; ++attempt) {
    for (;;) {
      r.stats = centered_clip_with(out, inputs, weights, cfg, tau, cut);
      r.residual =
          fixed_point_residual(out, inputs, weights, true, r.stats.tau, cfg.max_weight_ratio, cut);
      r.within = r.residual <= check.rel_tol * norm(out);
      if (r.within || cfg.max_iterations >= max_iterations_cap) break;
      cfg.max_iterations = std::min(max_iterations_cap, cfg.max_iterations * 2);
      cfg.tolerance = std::min(cfg.tolerance, check.rel_tol * 1e-2);
    }
    if (!adaptive || attempt == kRetries) return r;
    std::vector<double> d;
    for (const auto& g : inputs) d.push_back(norm_diff(g, out));
    const double med = check_median(std::move(d));
    if (r.stats.tau >= check.tau_slack * check.tau_scale * med) return r;
    tau = check.tau_scale * med;
  }
}

void apply_aggregation(CheckConfig& check, const AggregationConfig& agg) {
  check.max_weight_ratio = agg.max_weight_ratio;
  check.fixed_tau = agg.tau;
  check.tau_scale = agg.tau_scale;
  check.cut = effective_cut(agg);
}

const char* to_string(EvidenceKind k) {
  switch (k) {
    case EvidenceKind::commitment_conflict:
      return "commitment_conflict";
    case EvidenceKind::part_mismatch:
      return "part_mismatch";
    case EvidenceKind::receipt_conflict:
      return "receipt_conflict";
    case EvidenceKind::bad_result_norm:
      return "bad_result_norm";
    case EvidenceKind::wrong_average:
      return "wrong_average";
    case EvidenceKind::false_report:
      return "false_report";
    case EvidenceKind::report_conflict:
      return "report_conflict";
  }
  return "unknown";
}

result<Verdict> verify_evidence(const Evidence& e, const CheckConfig& cfg) {
  switch (e.kind) {
    case EvidenceKind::commitment_conflict: {
      if (e.commitments.size() != 2) return bad("commitment_conflict: needs two commitments");
      const auto& a = e.commitments[0];
      const auto& b = e.commitments[1];
      if (a.key != b.key || a.round != b.round || a.subround != b.subround || a.sender != b.sender)
        return bad("commitment_conflict: not the same member and sub-round");
      if (encode(a) == encode(b)) return bad("commitment_conflict: the commitments are equal");
      if (a.parts == b.parts && a.weight == b.weight && a.nonce_hash == b.nonce_hash)
        return bad("commitment_conflict: same content");
      if (!verify_sig(a) || !verify_sig(b)) return bad("commitment_conflict: bad signature");
      ST_TRY(member_signed(a, e.info, round_id(e.info), a.sender, "commitment"));
      return Verdict{a.key, e.kind, a.round, a.subround, 0, false};
    }
    case EvidenceKind::part_mismatch: {
      if (e.commitments.size() != 1 || e.receipts.size() != 1)
        return bad("part_mismatch: needs a commitment and a part");
      const auto& c = e.commitments[0];
      const auto& p = e.receipts[0];
      if (!contradicts(c, p)) return bad("part_mismatch: the part matches its commitment");
      if (!verify_sig(c) || !verify_sig(p)) return bad("part_mismatch: bad signature");
      ST_TRY(member_signed(c, e.info, round_id(e.info), c.sender, "commitment"));
      return Verdict{c.key, e.kind, c.round, c.subround, p.part, false};
    }
    case EvidenceKind::receipt_conflict: {
      if (e.receipts.size() != 2) return bad("receipt_conflict: needs two receipts");
      const auto& a = e.receipts[0];
      const auto& b = e.receipts[1];
      if (a.kind != b.kind || a.key != b.key || a.round != b.round || a.subround != b.subround ||
          a.part != b.part || a.signer != b.signer)
        return bad("receipt_conflict: not the same signer and part");
      if (a.data_hash == b.data_hash && a.weight == b.weight && a.tau == b.tau &&
          a.clip == b.clip && a.norm == b.norm && a.counted == b.counted)
        return bad("receipt_conflict: same content");
      if (!verify_sig(a) || !verify_sig(b)) return bad("receipt_conflict: bad signature");
      ST_TRY(member_signed(a, e.info, round_id(e.info), a.signer, "receipt"));
      return Verdict{a.key, e.kind, a.round, a.subround, a.part, false};
    }
    case EvidenceKind::bad_result_norm: {
      if (e.receipts.size() != 1) return bad("bad_result_norm: needs the result");
      const auto& r = e.receipts[0];
      if (r.kind != DataKind::result) return bad("bad_result_norm: not a result");
      if (hash_floats(e.data) != r.data_hash) return bad("bad_result_norm: values do not match");
      if (near(norm(e.data), r.norm, cfg.norm_tol, 0))
        return bad("bad_result_norm: the norm is right");
      if (!verify_sig(r)) return bad("bad_result_norm: bad signature");
      ST_TRY(member_signed(r, e.info, round_id(e.info), r.signer, "result"));
      return Verdict{r.key, e.kind, r.round, r.subround, r.part, false};
    }
    case EvidenceKind::wrong_average:
      return verify_wrong_average(e, cfg);
    case EvidenceKind::false_report:
      return verify_false_report(e, cfg);
    case EvidenceKind::report_conflict: {
      if (e.reports.size() != 2) return bad("report_conflict: needs two reports");
      const auto& a = e.reports[0];
      const auto& b = e.reports[1];
      if (a.key != b.key || a.round != b.round || a.subround != b.subround || a.part != b.part ||
          a.member != b.member)
        return bad("report_conflict: not the same member and part");
      if (a.seed == b.seed && a.result_hash == b.result_hash && a.weight == b.weight &&
          a.proj == b.proj && a.dist == b.dist)
        return bad("report_conflict: same content");
      if (!verify_sig(a) || !verify_sig(b)) return bad("report_conflict: bad signature");
      ST_TRY(member_signed(a, e.info, round_id(e.info), a.member, "report"));
      return Verdict{a.key, e.kind, a.round, a.subround, a.part, false};
    }
  }
  return bad("evidence: unknown kind");
}

Evidence commitment_conflict(const RoundInfo& info, const Commitment& a, const Commitment& b) {
  Evidence e;
  e.info = info;
  e.kind = EvidenceKind::commitment_conflict;
  e.commitments = {a, b};
  return e;
}

Evidence part_mismatch(const RoundInfo& info, const Commitment& c, const DataReceipt& part) {
  Evidence e;
  e.info = info;
  e.kind = EvidenceKind::part_mismatch;
  e.commitments = {c};
  e.receipts = {part};
  return e;
}

Evidence receipt_conflict(const RoundInfo& info, const DataReceipt& a, const DataReceipt& b) {
  Evidence e;
  e.info = info;
  e.kind = EvidenceKind::receipt_conflict;
  e.receipts = {a, b};
  return e;
}

Evidence report_conflict(const RoundInfo& info, const ProjectionReport& a,
                         const ProjectionReport& b) {
  Evidence e;
  e.info = info;
  e.kind = EvidenceKind::report_conflict;
  e.reports = {a, b};
  return e;
}

}  // namespace starling::averaging::acct
