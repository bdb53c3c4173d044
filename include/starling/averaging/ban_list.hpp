// Bans from verified evidence (issue 20 item 2): a locally held ban list, and signed
// accusation records that carry evidence, which any peer checks before banning.
//
// Rules:
// - Only verified evidence bans (accountability.hpp verify_evidence()). Evidence needs the
//   accused's own signatures, so no number of peers can ban an honest one.
// - An accusation is signed by its accuser. A bad accuser signature: ignored (it cannot be
//   attributed). Evidence that does not verify: the accuser is banned (false accusation).
// - wrong_average evidence is not proof on its own: it rests on the members' projection
//   reports, and a member's lie is only exposed by the owner, who holds its values. This
//   peer's own wrong_average evidence (add_evidence: its check failed and the owner did not
//   answer inside the round) is pending at once. An accusation (the directory) is a vote: the
//   owner becomes pending only once more than half of the round's members (RoundInfo::members,
//   the owner included in the count) have each accused it of the same part with verified
//   evidence. A minority of the group (the threat model) cannot reach that against an honest
//   owner: honest members never publish against it, since it answers every lying report
//   inside the round; a cheating owner is accused by every honest member (docs/security.md).
// - Pending verdicts wait `grace`: the owner may answer with false_report evidence for the
//   same (round, sub-round, part), which bans the lying member and clears the owner. tick()
//   turns pending verdicts older than `grace` into bans.
// - Reports this peer received inside its rounds are remembered (remember(), the last
//   kMaxRemembered): a wrong_average accusation carrying another report of the same member for
//   the same part is report_conflict evidence against that member (it lied in the directory
//   and not in the round): banned here, and the evidence is kept for the caller to publish
//   (take_found()).
// - One judgement per accuser and subject (kind, round, sub-round, part, accused): later
//   accusations by the same accuser about the same thing are skipped unverified. Evidence
//   already judged (the same bytes from several accusers) is not verified again.
// - A ban lasts for the run (the list lives as long as the node). Callers exclude banned keys
//   from matchmaking and averaging and refuse their connections.
//
// Threading rule: single-threaded (the node's I/O thread); no I/O.
#pragma once

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "starling/averaging/accountability.hpp"
#include "starling/core/clock.hpp"
#include "starling/core/fifo_map.hpp"

namespace starling::averaging::acct {

struct Accusation {
  PubKey accuser{};
  Evidence evidence;
  Sig sig{};
  friend bool operator==(const Accusation&, const Accusation&) = default;
};
Accusation make_accusation(Evidence e, const crypto::KeyPair& accuser);
bool verify_sig(const Accusation& a);
Bytes encode(const Accusation& a);
result<Accusation> decode_accusation(BytesView b);

struct BanRecord {
  PubKey peer{};
  std::string reason;  // "part_mismatch", "false accusation", ...
  TimePoint since{};
};

class BanList {
 public:
  BanList(CheckConfig cfg, Duration grace) : cfg_(cfg), grace_(grace) {}
  // Only evidence about rounds whose RoundInfo::context starts with `prefix` (this run's) is
  // judged; other evidence is refused with a logged reason and bans nobody.
  void set_run_prefix(Bytes prefix) { run_prefix_ = std::move(prefix); }

  // Evidence this peer collected or received. Errors: the evidence proves nothing (nobody is
  // banned for it here: the caller did not sign it).
  result<Verdict> add_evidence(const Evidence& e, TimePoint now);
  // An accusation (e.g. from the DHT). Errors: bad signature (ignored), or false evidence
  // (the accuser is banned, and the error says so).
  result<Verdict> add_accusation(const Accusation& a, TimePoint now);
  void tick(TimePoint now);
  // This peer's own verdict without evidence a third party could check (the gradient check:
  // its re-computation of the peer's values differs, grad_check.hpp): banned here only,
  // nothing to publish.
  void convict(const PubKey& k, std::string reason, TimePoint now) {
    ban(k, std::move(reason), now);
  }
  // A report received (or sent) inside a round, kept to expose a member that publishes another.
  static constexpr std::size_t kMaxRemembered = 1u << 16;
  // Entries held in the largest of the memories above (tests: they stay bounded).
  std::size_t memory_entries() const;
  void remember(const ProjectionReport& r);
  // Evidence this list found itself (report_conflict), to publish; emptied by the call.
  std::vector<Evidence> take_found() { return std::exchange(found_, {}); }

  bool banned(const PubKey& k) const { return bans_.count(k) != 0; }
  bool suspected(const PubKey& k) const;
  // True iff some part of `k` is pending or has directory votes against it (its answers, e.g.
  // detached false_report records, are read first: acct_records.hpp).
  bool accused(const PubKey& k) const;
  std::vector<BanRecord> bans() const;
  std::size_t pending() const { return pending_.size(); }
  // True once add_accusation() has judged this exact accusation (later copies are skipped),
  // or one by the same accuser about the same subject.
  bool seen(const Accusation& a) const;
  // Members that accused the owner of (round, sub-round, part) in the directory.
  std::size_t votes(const Hash32& round, std::uint32_t subround, std::uint32_t part) const;

 private:
  using Slot = std::tuple<Hash32, std::uint32_t, std::uint32_t>;  // round, sub-round, part
  struct Pending {
    PubKey owner{};
    TimePoint since{};
  };
  struct Votes {
    PubKey owner{};
    std::size_t members = 0;
    std::set<PubKey> accusers;
  };
  struct Judged {
    bool ok = false;
    Verdict verdict;
    std::string why;
  };
  void ban(const PubKey& k, std::string reason, TimePoint now);
  // verify_evidence() once per distinct evidence.
  result<Verdict> judge(const Evidence& e);
  void apply(const Verdict& d, TimePoint now);
  result<Verdict> vote(const Accusation& a, const Verdict& d, TimePoint now);
  void expose_conflicts(const Evidence& e, TimePoint now);

  bool known_round(const Evidence& e) const;

  CheckConfig cfg_;
  Duration grace_;
  Bytes run_prefix_;
  std::map<PubKey, BanRecord> bans_;
  std::map<Slot, Pending> pending_;
  // Memories fed by what peers publish hold the last kMaxRemembered entries each: forgetting
  // an old one costs a re-verification (or restarts an old round's vote count), never a ban.
  FifoMap<Slot, bool> cleared_{kMaxRemembered};     // slots answered with false_report evidence
  FifoMap<Hash32, bool> seen_{kMaxRemembered};      // accusations judged (their signature's hash)
  FifoMap<Hash32, bool> subjects_{kMaxRemembered};  // (accuser, subject) pairs judged
  FifoMap<Slot, Votes> votes_{kMaxRemembered};      // directory wrong_average accusations
  FifoMap<Hash32, Judged> judged_{kMaxRemembered};  // evidence verified, by its encoding's hash
  using ReportSlot = std::tuple<Hash32, std::uint32_t, std::uint32_t, std::uint32_t>;
  // Remembered reports, by (round, sub-round, part, member).
  FifoMap<ReportSlot, ProjectionReport> reports_{kMaxRemembered};
  std::vector<Evidence> found_;
};

}  // namespace starling::averaging::acct
