// RoundAcct (round_acct.hpp): accusations after the aggregation check and the owners' answers.
// A member's failed check accuses the part's owner; the owner answers with false_report
// evidence when a report about its part lies; only an accusation left unanswered becomes
// evidence, so a lying member cannot get an honest owner banned inside the round (a lie
// published in the directory is not answered yet: docs/security.md, "Known gap").
#include <algorithm>

#include "round_acct.hpp"
#include "starling/core/log.hpp"

namespace starling::averaging::detail {

using namespace acct;

namespace {

Error bad(const std::string& why) {
  return make_error(errc::protocol_violation, "accountability: " + why);
}

constexpr std::uint8_t kTagPiece = 0xCF;

}  // namespace

std::vector<std::pair<std::uint32_t, Evidence>> RoundAcct::accusations() const {
  std::vector<std::pair<std::uint32_t, Evidence>> out;
  for (const auto& [slot, e] : accused_)
    if (!refuted_.count(slot)) out.emplace_back(e.receipts.at(0).signer, e);
  return out;
}

std::vector<std::uint32_t> RoundAcct::accused_owners() const {
  std::vector<std::uint32_t> out;
  for (const auto& [slot, e] : accused_) {
    const auto owner = e.receipts.at(0).signer;
    if (!refuted_.count(slot) && std::find(out.begin(), out.end(), owner) == out.end())
      out.push_back(owner);
  }
  return out;
}

std::vector<Bytes> RoundAcct::pieces(const Evidence& e) {
  const Bytes all = encode(e);
  std::vector<Bytes> out;
  const std::size_t count = (all.size() + kPieceBytes - 1) / kPieceBytes;
  if (count == 0 || count > kMaxPieces) return out;  // over decode_evidence()'s limits
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t begin = i * kPieceBytes, end = std::min(all.size(), begin + kPieceBytes);
    Bytes p{kTagPiece, static_cast<std::uint8_t>(i), static_cast<std::uint8_t>(count)};
    p.insert(p.end(), all.begin() + static_cast<std::ptrdiff_t>(begin),
             all.begin() + static_cast<std::ptrdiff_t>(end));
    out.push_back(std::move(p));
  }
  return out;
}

// Pieces come in order on the sender's one stream to this member.
result<void> RoundAcct::on_piece(std::uint32_t from, BytesView b) {
  if (b.size() < 4) return bad("empty piece of evidence");
  const std::uint8_t index = b[1], count = b[2];
  auto& a = assembly_[from];
  if (count == 0 || count > kMaxPieces || index >= count) return bad("piece out of range");
  if (index == 0) a = Assembly{count, 0, {}};
  if (index != a.next || count != a.count) return bad("piece out of order");
  a.buf.insert(a.buf.end(), b.begin() + 3, b.end());
  if (++a.next < count) return success();
  auto e = decode_evidence(a.buf);
  a = Assembly{};
  if (!e) return bad("evidence: " + e.error().message());
  return on_evidence_from(from, e.value());
}

result<void> RoundAcct::on_evidence_from(std::uint32_t from, const Evidence& e) {
  if (!(e.info == info_)) return bad("evidence about another round");
  const bool accusation = e.kind == EvidenceKind::wrong_average && e.receipts.size() == 1 &&
                          e.receipts[0].signer == self_;
  const bool answer = e.kind == EvidenceKind::false_report && e.receipts.size() == 2 &&
                      e.receipts[1].signer == from;
  if (!accusation && !answer) return bad("evidence other than an accusation of us or an answer");
  auto v = verify_evidence(e, cfg_->check);
  if (!v) return bad("evidence does not verify: " + v.error().message());
  if (accusation) {
    // Its reports (signed, of this round) stand in for any this owner has not received, so
    // that its own check can run; a member that sent it another report is answered from the
    // accusation's copy (answer_candidates()).
    for (const auto& rp : e.reports) reports_.try_emplace({rp.subround, rp.part, rp.member}, rp);
    accusations_in_.push_back(e);
    return success();
  }
  refuted_.insert({v.value().subround, v.value().part});
  ++evidence_;
  if (cfg_->on_evidence) cfg_->on_evidence(e);  // the liar's ban
  return success();
}

void RoundAcct::settle(const std::vector<SettledPart>& parts) {
  for (const auto& p : parts) ranges_[{p.subround, p.part}] = p.range;
}

// `reveals`: this member's own when it ran the check, else the accusation's (verified with
// it): an owner that missed a reveal still answers.
std::optional<Evidence> RoundAcct::candidate(std::uint32_t sub, std::uint32_t part,
                                             const ProjectionReport& rp,
                                             const std::vector<Reveal>& reveals,
                                             std::span<const float> output) const {
  auto res = results_.find({sub, part});
  auto kept = kept_.find({sub, part});
  auto range = ranges_.find({sub, part});
  auto pr = part_receipts_.find({sub, part, rp.member});
  if (res == results_.end() || res->second.signer != self_ || kept == kept_.end() ||
      range == ranges_.end() || pr == part_receipts_.end() || rp.member == self_ ||
      kept->second.size() != res->second.counted.size() || range->second.end > output.size())
    return std::nullopt;
  const auto& counted = res->second.counted;
  const auto at = std::find(counted.begin(), counted.end(), rp.member);
  if (at == counted.end()) return std::nullopt;
  Evidence e;
  e.kind = EvidenceKind::false_report;
  e.info = info_;
  e.receipts = {pr->second, res->second};
  e.reveals = reveals;
  e.reports = {rp};
  e.data = kept->second[static_cast<std::size_t>(at - counted.begin())];
  const auto values = output.subspan(range->second.begin, range->second.size());
  e.data2.assign(values.begin(), values.end());
  return e;
}

std::vector<Evidence> RoundAcct::answer_candidates(std::span<const float> output) const {
  std::vector<Evidence> out;
  std::set<Bytes> seen = answered_reports_;
  auto add = [&](std::uint32_t sub, std::uint32_t part, const ProjectionReport& rp,
                 const std::vector<Reveal>& reveals) {
    if (!seen.insert(encode(rp)).second) return;
    if (auto e = candidate(sub, part, rp, reveals, output)) out.push_back(std::move(*e));
  };
  std::vector<Reveal> mine;
  for (const auto& r : reveals_)
    if (r) mine.push_back(*r);
  for (const auto& p : own_failed_) {
    const DataReceipt* res = result_of(p.subround, p.part);
    if (!res) continue;
    for (auto m : res->counted)
      if (auto it = reports_.find({p.subround, p.part, m}); it != reports_.end())
        add(p.subround, p.part, it->second, mine);
  }
  for (const auto& e : accusations_in_)
    for (const auto& rp : e.reports) add(rp.subround, rp.part, rp, e.reveals);
  return out;
}

void RoundAcct::answer(Evidence e) {
  answered_reports_.insert(encode(e.reports.at(0)));
  found(std::move(e));
}

void RoundAcct::conclude() {
  for (auto& [slot, e] : accused_)
    if (!refuted_.count(slot)) found(std::move(e));
  accused_.clear();
}

}  // namespace starling::averaging::detail
