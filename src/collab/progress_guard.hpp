// ProgressGuard: keeps the progress view sane against fake and inflated progress records
// (docs/security.md, "Progress records"). Every record in the run's progress key is signed by
// its peer's key (one record per peer counts), but keys are free: one attacker can publish
// records under many fresh identities (a flood), or claim far more samples than it computes.
// The guard, applied to every fetch before the optimizer's tracker sees it:
// - vouched peers (members of a round this peer completed, vouch()) always pass; the others
//   (unproven) only if this host met them (a connection authenticated their key: met(); once
//   require_met() is set: NetCollaboration does), at most kMaxUnproven at a time, the ones first
//   seen earliest first (kMaxUnprovenStartup while fewer than two vouched peers are in the fetch:
//   at startup every peer is unproven). A flood after the collaboration formed adds at most
//   kMaxUnproven peers to the view, so it cannot inflate the majority a round needs past the honest
//   peers;
// - once two vouched peers are in the fetch, an unproven peer claiming an epoch more than one
//   past the vouched peers' latest is dropped (it would send every peer to download a state
//   nobody serves);
// - every admitted record's samples/s and accumulated samples are capped at kClaimRatio x the
//   median of the vouched records (all admitted records at startup; rates, and accumulated
//   samples at the record's epoch, or the rate cap x 1 s when that median is 0), an unproven
//   peer's at 1 x the median: a minority cannot buy the epoch with claims.
// Records that do not decode pass unchanged (the tracker rejects them with a logged reason).
//
// Threading rule: the collaboration's executor.
#pragma once

#include <map>
#include <set>
#include <vector>

#include "starling/core/clock.hpp"
#include "starling/training/collaboration.hpp"

namespace starling::collab {

class ProgressGuard {
 public:
  static constexpr std::size_t kMaxUnproven = 2;
  static constexpr std::size_t kMaxUnprovenStartup = 16;
  static constexpr double kClaimRatio = 4;
  static constexpr std::size_t kMaxRemembered = 4096;  // first-seen times kept

  struct Stats {
    std::size_t unproven_dropped = 0;  // over the unproven cap
    std::size_t unmet_dropped = 0;     // unproven and never connected to this host
    std::size_t epoch_dropped = 0;     // unproven, epoch implausibly far ahead
    std::size_t capped = 0;            // claims cut to the caps
  };

  void vouch(const net::PeerId& peer) { vouched_.insert(peer); }
  void met(const net::PeerId& peer) {
    if (met_.size() < kMaxRemembered) met_.insert(peer);
  }
  void require_met() { require_met_ = true; }
  bool vouched(const net::PeerId& peer) const { return vouched_.count(peer) != 0; }
  std::vector<training::ProgressEntry> filter(std::vector<training::ProgressEntry> in,
                                              TimePoint now, Stats* stats = nullptr);

 private:
  std::set<net::PeerId> vouched_, met_;
  bool require_met_ = false;
  std::map<net::PeerId, TimePoint> first_seen_;
};

}  // namespace starling::collab
