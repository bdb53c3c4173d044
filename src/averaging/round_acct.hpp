// RoundAcct: the accountability of one networked round (docs/security.md, "Wiring it into the
// networked round"): the statements this member signs, the ones it holds from the others,
// their checks and the evidence they give. The round runner moves the bytes and runs the
// hashing and projections on the pool (round_runner_acct.cpp); this class does no I/O and
// touches no vector bigger than a part's receipt.
//
// A round's statements: a Commitment per sub-round before this member's first part; a part
// receipt with every PART and a result receipt with every RESULT; after the all-gather a
// Reveal, the commitments and result receipts it holds from the others (relayed, so that a
// member who committed, or an owner who answered, differently to different members is
// caught), then one ProjectionReport per settled part it is counted in. After the aggregation
// check, a failed part's wrong_average evidence is an accusation, not yet a verdict: it goes to
// the accused owner, every member then marks that it has checked, each owner answers every
// accusation of its parts it can refute (false_report evidence against the lying member, sent
// to the group in pieces) and marks that it has answered, and a member concludes only once
// every owner it accused has answered or gone: unanswered accusations become evidence.
//
// Threading rule: the host's executor.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "starling/averaging/accountability.hpp"
#include "starling/averaging/round_core.hpp"

namespace starling::averaging::detail {

// Test-only cheating (AccountabilityConfig::attack): an owner that shifts the results it
// returns, a member that sends the next member's parts other values than it committed, or one
// that lies in its reports on the parts other members own (and hides the lie from the owner).
// directory_lie: reports honestly but hands on_forged a wrong_average accusation of every
// other owner's part, built from a lying report of its own (to publish outside the round).
enum class RoundAttack : std::uint8_t {
  none,
  wrong_average,
  different_parts,
  false_report,
  directory_lie
};

struct RoundAcctConfig {
  crypto::KeyPair key;  // this member's identity key (signs every statement)
  Bytes context;        // RoundInfo::context: the run, the round's name and the group id
  acct::CheckConfig check;
  // Evidence this member found (called on the host's executor).
  std::function<void(const acct::Evidence&)> on_evidence;
  RoundAttack attack = RoundAttack::none;
  std::function<void(const acct::Evidence&)> on_forged;  // directory_lie's accusations
  // Every verified report received from another member (BanList::remember).
  std::function<void(const acct::ProjectionReport&)> on_report;
  std::uint32_t grad_check_targets = 0;  // AccountabilityConfig::grad_check_targets
};

// What an owner's reduction of a part gives the result's receipt (computed on the pool).
struct ResultStat {
  acct::Hash32 hash{};
  double norm = 0;
  bool clip = false;
  double tau = 0;
};

// Evidence travels between members in ACCT pieces (tag 0xCF, index, count, bytes): its encoding
// cut in at most kMaxPieces pieces of at most kPieceBytes each (a part's worth of values may
// exceed one frame).
constexpr std::size_t kPieceBytes = 512u << 10;
constexpr std::size_t kMaxPieces = 8;

// A part whose result is final (RoundCore::coverage()) and this member's projection of it.
struct SettledPart {
  std::uint32_t subround = 0, part = 0, owner = 0;
  Segment range;
  Bitset counted;
};

class RoundAcct {
 public:
  RoundAcct(std::shared_ptr<const RoundAcctConfig> cfg, acct::RoundInfo info, std::uint32_t self);

  const RoundAcctConfig& config() const { return *cfg_; }
  const acct::RoundInfo& info() const { return info_; }
  const acct::Hash32& round() const { return round_; }
  std::size_t evidence_count() const { return evidence_; }

  // --- what this member sends ---
  bool committed(std::uint32_t sub) const { return mine_.count(sub) != 0; }
  // Signs and keeps the commitment for `sub` (`hashes`: this member's values of every part of
  // the sub-round). Returns its encoding.
  Bytes commit(std::uint32_t sub, double weight, std::vector<acct::Hash32> hashes);
  // Test-only different-parts: the values sent for (sub, part) instead of the committed ones.
  void set_tampered(std::uint32_t sub, std::uint32_t part, std::vector<float> values);
  const std::vector<float>* tampered(std::uint32_t sub, std::uint32_t part) const;
  // The signed receipt for this member's part (sub, part); empty if not committed.
  Bytes part_receipt(std::uint32_t sub, std::uint32_t part, double weight) const;
  void set_result(std::uint32_t sub, std::uint32_t part, const ResultStat& s);
  // An owner keeps the values it reduced a part from (in counted order) until the check, to
  // answer a lying report.
  void keep_inputs(std::uint32_t sub, std::uint32_t part, std::vector<std::vector<float>> v);
  // The kept inputs of a part reduced here (counted order), null if none.
  const std::vector<std::vector<float>>* kept(std::uint32_t sub, std::uint32_t part) const {
    auto it = kept_.find({sub, part});
    return it == kept_.end() ? nullptr : &it->second;
  }
  // The signed receipt of a part reduced here, made once (null: not reduced here).
  std::shared_ptr<const Bytes> result_receipt(std::uint32_t sub, std::uint32_t part,
                                              const Bitset& counted);
  Bytes reveal() const;
  // The commitments held from the others and the result receipts received, for `to`.
  std::vector<Bytes> relays(std::uint32_t to) const;

  // --- what it receives (errors: the sender broke the protocol; the runner blames it) ---
  // Any ACCT statement from member `from` (its own, or one it relays).
  result<void> on_statement(std::uint32_t from, BytesView b);
  // A part receipt already checked against the part's values (acct::check_part on the pool):
  // compared with the sender's commitment (part_mismatch evidence).
  result<void> on_part(std::uint32_t from, const acct::DataReceipt& r);
  // A result receipt from owner `from` already checked against the values, whose norm is
  // `norm`: the signed norm (bad_result_norm evidence) and the counted set are checked.
  result<void> on_result(std::uint32_t from, const ResultMsg& m, const acct::DataReceipt& r,
                         double norm, std::span<const float> values);

  // --- after the all-gather ---
  // The settled parts (their ranges, to answer accusations even without a check here).
  void settle(const std::vector<SettledPart>& parts);
  bool have_reveals() const;
  std::vector<std::uint32_t> missing_reveals() const;
  acct::Hash32 seed() const;  // valid once have_reveals()
  // This member's report on a settled part (its projection computed on the pool).
  Bytes report(const SettledPart& p, double weight, const acct::Projection& pj);
  // Members counted in a settled part whose report has not come (or did not check).
  std::vector<std::uint32_t> missing_reports(const std::vector<SettledPart>& parts) const;
  // The aggregation check of every settled part: wrong_average evidence against other owners.
  // Returns the parts checked; this member's own parts that fail are in own_failed().
  std::size_t check(const std::vector<SettledPart>& parts);
  const std::vector<SettledPart>& own_failed() const { return own_failed_; }

  // --- accusations and answers, after the check ---
  // The wrong_average evidence of check() against other owners, by owner, to send to them.
  std::vector<std::pair<std::uint32_t, acct::Evidence>> accusations() const;
  // Owners accused by this member that have not answered yet.
  std::vector<std::uint32_t> accused_owners() const;
  static Bytes checked_marker() { return {0xC6}; }   // sent after the accusations
  static Bytes answered_marker() { return {0xC7}; }  // sent after the answers
  bool checked_by(std::uint32_t j) const { return j < checked_.size() && checked_[j]; }
  bool answered_by(std::uint32_t j) const { return j < answered_by_.size() && answered_by_[j]; }
  static std::vector<Bytes> pieces(const acct::Evidence& e);
  // An owner's false_report candidates (its kept values, the result `output` holds) against
  // every report about its parts that made a check fail: every counted member's report of its
  // own failed parts, and the reports in the accusations it received. Verified on the pool;
  // those that verify expose a liar (answer(): it goes to the group and the ban list).
  std::vector<acct::Evidence> answer_candidates(std::span<const float> output) const;
  void answer(acct::Evidence e);
  // Accusations whose owner did not answer become evidence (on_evidence).
  void conclude();

 private:
  using Key = std::pair<std::uint32_t, std::uint32_t>;  // (sub-round, part) or (sub, member)
  void found(acct::Evidence e);
  void forge(const acct::DataReceipt& res, std::vector<acct::ProjectionReport> reports) const;
  acct::DataReceipt receipt(acct::DataKind kind, std::uint32_t sub, std::uint32_t part) const;
  const acct::DataReceipt* result_of(std::uint32_t sub, std::uint32_t part) const;
  bool valid_report(const acct::ProjectionReport& r) const;
  result<void> on_piece(std::uint32_t from, BytesView b);
  result<void> on_evidence_from(std::uint32_t from, const acct::Evidence& e);
  std::optional<acct::Evidence> candidate(std::uint32_t sub, std::uint32_t part,
                                          const acct::ProjectionReport& rp,
                                          const std::vector<acct::Reveal>& reveals,
                                          std::span<const float> output) const;

  std::shared_ptr<const RoundAcctConfig> cfg_;
  acct::RoundInfo info_;
  acct::Hash32 round_;
  std::uint32_t self_;
  acct::PubKey me_{};
  acct::Hash32 nonce_{};
  acct::CommitmentLedger ledger_;
  std::map<std::uint32_t, acct::Commitment> mine_;  // by sub-round
  std::map<Key, std::vector<float>> tampered_;
  std::map<Key, acct::Hash32> tampered_hash_;
  std::map<Key, ResultStat> stats_;                      // parts reduced here
  std::map<Key, std::vector<std::vector<float>>> kept_;  // their inputs, in counted order
  std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>, acct::DataReceipt>
      part_receipts_;  // (sub, part, sender): parts received here
  std::vector<SettledPart> own_failed_;
  std::map<Key, acct::DataReceipt> results_;                 // result receipts (own and received)
  std::map<Key, std::shared_ptr<const Bytes>> result_wire_;  // own, encoded
  std::vector<std::optional<acct::Reveal>> reveals_;
  std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>, acct::ProjectionReport>
      reports_;  // (sub, part, member)
  std::size_t evidence_ = 0;
  std::map<Key, Segment> ranges_;               // settled parts (settle())
  std::map<Key, acct::Evidence> accused_;       // wrong_average evidence against other owners
  std::set<Key> refuted_;                       // slots an owner answered (false_report)
  std::vector<acct::Evidence> accusations_in_;  // against this member's parts
  std::set<Bytes> answered_reports_;            // reports this owner proved false
  std::vector<bool> checked_, answered_by_;     // markers received, by member
  struct Assembly {
    std::uint8_t count = 0, next = 0;
    Bytes buf;
  };
  std::vector<Assembly> assembly_;  // pieces of evidence in flight, by sender
};

}  // namespace starling::averaging::detail
