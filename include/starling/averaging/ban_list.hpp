// Bans from verified evidence (issue 20 item 2): a locally held ban list, and signed
// accusation records that carry evidence, which any peer checks before banning.
//
// Rules:
// - Only verified evidence bans (accountability.hpp verify_evidence()). Evidence needs the
//   accused's own signatures, so no number of peers can ban an honest one.
// - An accusation is signed by its accuser. A bad accuser signature: ignored (it cannot be
//   attributed). Evidence that does not verify: the accuser is banned (false accusation).
// - wrong_average verdicts are pending for `grace`: the owner may answer with false_report
//   evidence for the same (round, sub-round, part), which bans the lying member and clears the
//   owner. tick() turns pending verdicts older than `grace` into bans.
// - A ban lasts for the run (the list lives as long as the node). Callers exclude banned keys
//   from matchmaking and averaging and refuse their connections.
//
// Threading rule: single-threaded (the node's I/O thread); no I/O.
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "starling/averaging/accountability.hpp"
#include "starling/core/clock.hpp"

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

  bool banned(const PubKey& k) const { return bans_.count(k) != 0; }
  bool suspected(const PubKey& k) const;
  std::vector<BanRecord> bans() const;
  std::size_t pending() const { return pending_.size(); }
  // True once add_accusation() has judged this exact accusation (later copies are skipped).
  bool seen(const Accusation& a) const;

 private:
  using Slot = std::tuple<Hash32, std::uint32_t, std::uint32_t>;  // round, sub-round, part
  struct Pending {
    PubKey owner{};
    TimePoint since{};
  };
  void ban(const PubKey& k, std::string reason, TimePoint now);

  bool known_round(const Evidence& e) const;

  CheckConfig cfg_;
  Duration grace_;
  Bytes run_prefix_;
  std::map<PubKey, BanRecord> bans_;
  std::map<Slot, Pending> pending_;
  std::map<Slot, bool> cleared_;  // slots answered with false_report evidence
  std::map<Hash32, bool> seen_;   // accusations judged (by their signature's hash)
};

}  // namespace starling::averaging::acct
