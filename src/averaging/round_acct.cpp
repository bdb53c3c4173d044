// RoundAcct (round_acct.hpp): statements of one round, their checks and the evidence.
#include "round_acct.hpp"

#include <sodium.h>

#include <algorithm>
#include <cmath>

#include "starling/core/log.hpp"

namespace starling::averaging::detail {

using namespace acct;

namespace {

Error bad(const std::string& why) {
  return make_error(errc::protocol_violation, "accountability: " + why);
}

bool near(double a, double b, double rel) {
  return std::abs(a - b) <= rel * std::max({std::abs(a), std::abs(b), 1e-30});
}

// Signed by member `index` of `info` for round `round`.
template <class T>
bool member_signed(const T& s, const RoundInfo& info, const Hash32& round, std::uint32_t index) {
  return s.round == round && index < info.members.size() && info.members[index] == s.key &&
         verify_sig(s);
}

}  // namespace

RoundAcct::RoundAcct(std::shared_ptr<const RoundAcctConfig> cfg, RoundInfo info, std::uint32_t self)
    : cfg_(std::move(cfg)),
      info_(std::move(info)),
      round_(round_id(info_)),
      self_(self),
      me_(key_of(cfg_->key)),
      ledger_(info_),
      reveals_(info_.members.size()),
      checked_(info_.members.size()),
      answered_by_(info_.members.size()),
      assembly_(info_.members.size()) {
  randombytes_buf(nonce_.data(), nonce_.size());
  Reveal r{round_, self_, me_, nonce_, {}};
  sign(r, cfg_->key);
  reveals_[self_] = r;
}

Bytes RoundAcct::commit(std::uint32_t sub, double weight, std::vector<Hash32> hashes) {
  Commitment c;
  c.round = round_;
  c.subround = sub;
  c.sender = self_;
  c.weight = weight;
  c.nonce_hash = hash_nonce(nonce_);
  c.parts = std::move(hashes);
  sign(c, cfg_->key);
  (void)ledger_.add(c);
  mine_[sub] = c;
  return encode(c);
}

void RoundAcct::set_tampered(std::uint32_t sub, std::uint32_t part, std::vector<float> values) {
  tampered_hash_[{sub, part}] = hash_floats(values);
  tampered_[{sub, part}] = std::move(values);
}

const std::vector<float>* RoundAcct::tampered(std::uint32_t sub, std::uint32_t part) const {
  auto it = tampered_.find({sub, part});
  return it == tampered_.end() ? nullptr : &it->second;
}

DataReceipt RoundAcct::receipt(DataKind kind, std::uint32_t sub, std::uint32_t part) const {
  DataReceipt r;
  r.kind = kind;
  r.round = round_;
  r.subround = sub;
  r.part = part;
  r.signer = self_;
  return r;
}

Bytes RoundAcct::part_receipt(std::uint32_t sub, std::uint32_t part, double weight) const {
  auto c = mine_.find(sub);
  if (c == mine_.end() || part >= c->second.parts.size()) return {};
  DataReceipt r = receipt(DataKind::part, sub, part);
  r.weight = weight;
  auto t = tampered_hash_.find({sub, part});
  r.data_hash = t != tampered_hash_.end() ? t->second : c->second.parts[part];
  sign(r, cfg_->key);
  return encode(r);
}

void RoundAcct::set_result(std::uint32_t sub, std::uint32_t part, const ResultStat& s) {
  stats_[{sub, part}] = s;
}

void RoundAcct::keep_inputs(std::uint32_t sub, std::uint32_t part,
                            std::vector<std::vector<float>> v) {
  kept_[{sub, part}] = std::move(v);
}

std::shared_ptr<const Bytes> RoundAcct::result_receipt(std::uint32_t sub, std::uint32_t part,
                                                       const Bitset& counted) {
  if (auto it = result_wire_.find({sub, part}); it != result_wire_.end()) return it->second;
  auto st = stats_.find({sub, part});
  if (st == stats_.end()) return nullptr;
  DataReceipt r = receipt(DataKind::result, sub, part);
  r.data_hash = st->second.hash;
  r.clip = st->second.clip;
  r.tau = st->second.tau;
  r.norm = st->second.norm;
  r.counted = counted.indices();
  sign(r, cfg_->key);
  results_[{sub, part}] = r;
  auto wire = std::make_shared<const Bytes>(encode(r));
  result_wire_[{sub, part}] = wire;
  return wire;
}

Bytes RoundAcct::reveal() const {
  return encode(*reveals_[self_]);
}

std::vector<Bytes> RoundAcct::relays(std::uint32_t to) const {
  std::vector<Bytes> out;
  for (std::uint32_t s = 0; s < info_.members.size(); ++s) {
    if (s == to || s == self_) continue;
    for (const auto& [sub, mine] : mine_)
      if (const auto* c = ledger_.get(sub, s)) out.push_back(encode(*c));
  }
  for (const auto& [k, r] : results_)
    if (r.signer != to && r.signer != self_) out.push_back(encode(r));
  return out;
}

result<void> RoundAcct::on_statement(std::uint32_t from, BytesView b) {
  if (b.empty()) return bad("empty statement");
  const std::uint32_t n = static_cast<std::uint32_t>(info_.members.size());
  switch (b[0]) {
    case 0xC1: {  // commitment: the sender's own, or a copy it relays
      ST_TRY(auto c, decode_commitment(b));
      if (c.sender >= n) return bad("commitment from no member");
      ST_TRY(check_commitment(c, round_, c.subround, c.sender, info_.members[c.sender]));
      ST_TRY(auto e, ledger_.add(c));
      if (e) found(std::move(*e));
      return success();
    }
    case 0xC2: {  // a result receipt another member relays
      ST_TRY(auto r, decode_receipt(b));
      if (r.kind != DataKind::result || !member_signed(r, info_, round_, r.signer))
        return bad("relayed result receipt does not verify");
      if (const auto* mine = result_of(r.subround, r.part); mine && encode(*mine) != encode(r))
        found(receipt_conflict(info_, *mine, r));
      return success();
    }
    case 0xC3: {  // reveal
      ST_TRY(auto r, decode_reveal(b));
      if (r.member != from || !member_signed(r, info_, round_, from))
        return bad("reveal does not verify");
      for (const auto& [sub, mine] : mine_)
        if (const auto* c = ledger_.get(sub, from); c && c->nonce_hash != hash_nonce(r.nonce))
          return bad("reveal does not match the commitment");
      reveals_[from] = r;
      return success();
    }
    case 0xC4: {  // projection report
      ST_TRY(auto r, decode_report(b));
      if (r.member != from || !member_signed(r, info_, round_, from))
        return bad("report does not verify");
      reports_[{r.subround, r.part, from}] = r;
      if (cfg_->on_report) cfg_->on_report(r);
      return success();
    }
    case 0xC6:  // checked: the sender's accusations (if any) came before
    case 0xC7:  // answered: the sender's answers (if any) came before
      if (b.size() != 1) return bad("marker with a body");
      (b[0] == 0xC6 ? checked_ : answered_by_)[from] = true;
      return success();
    case 0xCF:  // a piece of evidence: an accusation of this owner, or an owner's answer
      return on_piece(from, b);
    default:
      return bad("unknown statement");
  }
}

result<void> RoundAcct::on_part(std::uint32_t from, const DataReceipt& r) {
  const Commitment* c = ledger_.get(r.subround, from);
  if (!c) return bad("part before its commitment");
  if (contradicts(*c, r)) {
    found(part_mismatch(info_, *c, r));
    return bad("part differs from its commitment (part_mismatch)");
  }
  part_receipts_[{r.subround, r.part, from}] = r;
  return success();
}

result<void> RoundAcct::on_result(std::uint32_t from, const ResultMsg& m, const DataReceipt& r,
                                  double norm, std::span<const float> values) {
  if (r.kind != DataKind::result || r.subround != m.subround || r.part != m.part ||
      r.signer != from || !member_signed(r, info_, round_, from))
    return bad("result receipt does not verify");
  if (r.counted != m.counted.indices()) return bad("result receipt names other members");
  if (!near(norm, r.norm, cfg_->check.norm_tol)) {
    Evidence e;
    e.kind = EvidenceKind::bad_result_norm;
    e.info = info_;
    e.receipts = {r};
    e.data.assign(values.begin(), values.end());
    found(std::move(e));
    return bad("result's signed norm is wrong (bad_result_norm)");
  }
  if (const auto* old = result_of(r.subround, r.part); old && encode(*old) != encode(r))
    found(receipt_conflict(info_, *old, r));
  results_[{r.subround, r.part}] = r;
  return success();
}

bool RoundAcct::have_reveals() const {
  return missing_reveals().empty();
}

std::vector<std::uint32_t> RoundAcct::missing_reveals() const {
  std::vector<std::uint32_t> out;
  for (std::uint32_t i = 0; i < reveals_.size(); ++i)
    if (!reveals_[i]) out.push_back(i);
  return out;
}

Hash32 RoundAcct::seed() const {
  std::vector<Hash32> nonces;
  for (const auto& r : reveals_) nonces.push_back(r ? r->nonce : Hash32{});
  return round_seed(round_, nonces);
}

const DataReceipt* RoundAcct::result_of(std::uint32_t sub, std::uint32_t part) const {
  auto it = results_.find({sub, part});
  return it == results_.end() ? nullptr : &it->second;
}

Bytes RoundAcct::report(const SettledPart& p, double weight, const Projection& pj) {
  const DataReceipt* res = result_of(p.subround, p.part);
  if (!res) return {};
  ProjectionReport r;
  r.round = round_;
  r.subround = p.subround;
  r.part = p.part;
  r.member = self_;
  r.seed = seed();
  r.result_hash = res->data_hash;
  r.weight = weight;
  r.proj = pj.proj;
  r.dist = pj.dist;
  if (cfg_->attack == RoundAttack::false_report && p.owner != self_) r.proj += 10 * pj.dist;
  sign(r, cfg_->key);
  reports_[{p.subround, p.part, self_}] = r;
  return encode(r);
}

bool RoundAcct::valid_report(const ProjectionReport& r) const {
  const DataReceipt* res = result_of(r.subround, r.part);
  return res && r.result_hash == res->data_hash && r.seed == seed();
}

std::vector<std::uint32_t> RoundAcct::missing_reports(const std::vector<SettledPart>& parts) const {
  std::vector<std::uint32_t> out;
  for (const auto& p : parts) {
    const DataReceipt* res = result_of(p.subround, p.part);
    if (!res) continue;
    for (auto m : res->counted) {
      auto it = reports_.find({p.subround, p.part, m});
      if ((it == reports_.end() || !valid_report(it->second)) &&
          std::find(out.begin(), out.end(), m) == out.end())
        out.push_back(m);
    }
  }
  return out;
}

std::size_t RoundAcct::check(const std::vector<SettledPart>& parts) {
  std::vector<Reveal> reveals;
  for (const auto& r : reveals_) {
    if (!r) return 0;
    reveals.push_back(*r);
  }
  std::size_t checked = 0;
  for (const auto& p : parts) {
    const DataReceipt* res = result_of(p.subround, p.part);
    if (!res) continue;
    std::vector<ProjectionReport> reports;
    for (auto m : res->counted) {
      auto it = reports_.find({p.subround, p.part, m});
      if (it == reports_.end() || !valid_report(it->second)) break;
      reports.push_back(it->second);
    }
    if (reports.size() != res->counted.size() || reports.empty()) continue;
    ++checked;
    if (cfg_->attack == RoundAttack::directory_lie && res->signer != self_) forge(*res, reports);
    const auto fp = check_fixed_point(reports, res->clip, res->tau, res->norm, cfg_->check);
    if (fp.ok()) continue;
    if (res->signer == self_) {  // a report lies, or this owner is broken: answer_candidates()
      own_failed_.push_back(p);
      continue;
    }
    logger("averaging")
        ->warn(
            "accountability: part {} of sub-round {} (owner {}) fails the aggregation check "
            "({} vs bound {}, tau {}): accused, waiting for its answer",
            p.part, p.subround, res->signer, fp.statistic, fp.bound,
            fp.tau_ok ? "ok" : "implausible");
    Evidence e;
    e.kind = EvidenceKind::wrong_average;
    e.info = info_;
    e.receipts = {*res};
    e.reveals = reveals;
    e.reports = std::move(reports);
    accused_[{p.subround, p.part}] = std::move(e);
  }
  return checked;
}

// Test-only directory_lie: this member's report of the part replaced by a lie (10x its
// distance added to its projection), which makes the check fail: evidence that verifies.
void RoundAcct::forge(const DataReceipt& res, std::vector<ProjectionReport> reports) const {
  auto mine = std::find_if(reports.begin(), reports.end(),
                           [this](const ProjectionReport& r) { return r.member == self_; });
  if (mine == reports.end() || !cfg_->on_forged) return;
  mine->proj += 10 * mine->dist;
  sign(*mine, cfg_->key);
  Evidence e;
  e.kind = EvidenceKind::wrong_average;
  e.info = info_;
  e.receipts = {res};
  for (const auto& r : reveals_) e.reveals.push_back(*r);
  e.reports = std::move(reports);
  if (verify_evidence(e, cfg_->check)) cfg_->on_forged(e);
}

void RoundAcct::found(Evidence e) {
  ++evidence_;
  logger("averaging")
      ->warn("accountability: member {} found {} evidence", self_, to_string(e.kind));
  if (cfg_->on_evidence) cfg_->on_evidence(e);
}

}  // namespace starling::averaging::detail
