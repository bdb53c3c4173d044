// Accountability for the all-reduce (BTARD's verification, issue 20 item 2): signed round
// statements, the evidence they make possible, and its verification. No I/O; pure functions.
//
// Statements (each signed with the member's Ed25519 identity key over a domain tag and its
// canonical encoding; the signed bytes are the wire bytes minus the signature):
//   Commitment   member -> group, before its parts: the hash of each part it will send in a
//                sub-round, its weight, and the hash of a fresh random nonce;
//   DataReceipt  with every part (kind part: sender -> owner) and every reduced part (kind
//                result: owner -> members): the hash of the values, so the bytes are bound
//                to their signer; a result also names its radius tau, its norm and the
//                members it counts;
//   Reveal       member -> group after the all-gather: the nonce. The round's seed is the
//                hash of the round id and every member's nonce (no member can choose it: each
//                committed to its nonce before seeing the others');
//   ProjectionReport  member -> group: for each part, <z, g_i - r> and |g_i - r|, with z the
//                part's +-1 vector drawn from the seed, g_i its values and r the result.
// Evidence is a set of statements (and, where needed, values) that any peer can check:
//   commitment_conflict  two different commitments for one (round, sub-round, member);
//   part_mismatch        a signed part whose hash (or weight) differs from the commitment:
//                        the sender gave different data to different owners;
//   receipt_conflict     two different signed receipts for one (round, sub-round, part, kind):
//                        an owner sent different results to different members;
//   bad_result_norm      a signed result whose values do not have the norm it declares;
//   wrong_average        the owner's signed result and every counted member's signed report,
//                        whose clipped weighted mean sum_i w_i c_i p_i / sum_i w_i c_i, with
//                        c_i = clip_coef(d_i, tau, cut) (CenteredClip's fixed-point equation
//                        projected on z; c_i = 1 for the mean) exceeds the bound, or whose
//                        declared tau is implausibly small (or leaves out a majority): the
//                        owner did not return the aggregate. Pending:
//                        the owner may answer with false_report evidence against a member;
//   false_report         a member's signed part and values, the signed result and values, and
//                        the member's report, which the values contradict: the member lied;
//   report_conflict      two different signed reports of one member for one (round, sub-round,
//                        part): it told the round one thing and the directory another.
// Evidence that does not verify is an error naming the reason: an accusation carrying it is
// false and bans the accuser (ban_list.hpp).
//
// Threading rule: plain functions and values, callable from any thread.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "starling/averaging/robust.hpp"
#include "starling/core/bytes.hpp"
#include "starling/core/result.hpp"
#include "starling/crypto/keys.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::averaging::acct {

using Hash32 = std::array<std::uint8_t, 32>;
using PubKey = std::array<std::uint8_t, 32>;  // raw Ed25519 public key
using Sig = std::array<std::uint8_t, 64>;

// Limits of the decoders (a statement or evidence from a peer is at most this big).
constexpr std::size_t kMaxMembers = 1024;
constexpr std::size_t kMaxCommittedParts = 1u << 16;
constexpr std::size_t kMaxEvidenceFloats = 1u << 19;  // two parts of make_plan()'s 1 MiB limit

// What makes a round unique: `context` (run id, group key, epoch, as the caller builds it) and
// the members' keys in group order.
struct RoundInfo {
  Bytes context;
  std::vector<PubKey> members;
  friend bool operator==(const RoundInfo&, const RoundInfo&) = default;
};
Hash32 round_id(const RoundInfo& info);
Hash32 hash_floats(std::span<const float> v);  // BLAKE2b-256 of the little-endian floats
Hash32 hash_nonce(const Hash32& nonce);
PubKey key_of(const crypto::KeyPair& k);
// The raw Ed25519 key of a peer id (nullopt: another key type).
std::optional<PubKey> key_of_peer(const net::PeerId& id);
// The peer id of a raw Ed25519 key (the inverse of key_of_peer).
net::PeerId peer_of_key(const PubKey& k);

struct Commitment {
  Hash32 round{};
  std::uint32_t subround = 0;
  std::uint32_t sender = 0;
  PubKey key{};
  double weight = 1.0;
  Hash32 nonce_hash{};
  std::vector<Hash32> parts;  // indexed by the sub-round's part index
  Sig sig{};
  friend bool operator==(const Commitment&, const Commitment&) = default;
};

enum class DataKind : std::uint8_t { part = 1, result = 2 };
struct DataReceipt {
  DataKind kind = DataKind::part;
  Hash32 round{};
  std::uint32_t subround = 0;
  std::uint32_t part = 0;
  std::uint32_t signer = 0;  // the sender (part) or the owner (result)
  PubKey key{};
  Hash32 data_hash{};
  double weight = 1.0;                 // part: the sender's weight
  bool clip = false;                   // result: CenteredClip (else the weighted mean)
  double tau = 0;                      // result: CenteredClip's radius
  double norm = 0;                     // result: |values|
  std::vector<std::uint32_t> counted;  // result: members in the reduction, ascending
  Sig sig{};
  friend bool operator==(const DataReceipt&, const DataReceipt&) = default;
};

struct Reveal {
  Hash32 round{};
  std::uint32_t member = 0;
  PubKey key{};
  Hash32 nonce{};
  Sig sig{};
  friend bool operator==(const Reveal&, const Reveal&) = default;
};

struct ProjectionReport {
  Hash32 round{};
  std::uint32_t subround = 0;
  std::uint32_t part = 0;
  std::uint32_t member = 0;
  PubKey key{};
  Hash32 seed{};
  Hash32 result_hash{};
  double weight = 1.0;
  double proj = 0;  // <z, g - r>
  double dist = 0;  // |g - r|
  Sig sig{};
  friend bool operator==(const ProjectionReport&, const ProjectionReport&) = default;
};

// Signing sets `key` and `sig`; verification checks the signature against `key` only (the
// caller checks that the key is the member it expects).
void sign(Commitment& s, const crypto::KeyPair& k);
void sign(DataReceipt& s, const crypto::KeyPair& k);
void sign(Reveal& s, const crypto::KeyPair& k);
void sign(ProjectionReport& s, const crypto::KeyPair& k);
bool verify_sig(const Commitment& s);
bool verify_sig(const DataReceipt& s);
bool verify_sig(const Reveal& s);
bool verify_sig(const ProjectionReport& s);

// Canonical encodings (a one-byte type tag, fixed-width little-endian fields, counts before
// lists). Decoders reject anything else: errc::invalid_argument, errc::too_large over a limit.
Bytes encode(const Commitment& s);
Bytes encode(const DataReceipt& s);
Bytes encode(const Reveal& s);
Bytes encode(const ProjectionReport& s);
result<Commitment> decode_commitment(BytesView b);
result<DataReceipt> decode_receipt(BytesView b);
result<Reveal> decode_reveal(BytesView b);
result<ProjectionReport> decode_report(BytesView b);

// --- checks a member runs on what it receives (errors name the reason) ---
// A commitment for this round, sub-round and member, signed by its key.
result<void> check_commitment(const Commitment& c, const Hash32& round, std::uint32_t subround,
                              std::uint32_t sender, const PubKey& key);
// A part receipt for this round/sub-round/part from `sender`, signed by its key, whose hash
// matches `data`. Does not compare with the commitment (that is part_mismatch evidence).
result<void> check_part(const DataReceipt& r, const Hash32& round, std::uint32_t subround,
                        std::uint32_t part, std::uint32_t sender, const PubKey& key,
                        std::span<const float> data);
// True iff the receipt contradicts the commitment (hash or weight): evidence.
bool contradicts(const Commitment& c, const DataReceipt& part);

// --- the aggregation check ---
struct CheckConfig {
  double sigmas = 8;      // the bound is sigmas x (rel_tol x |r| + abs_tol)
  double rel_tol = 1e-4;  // allowed fixed-point residual relative to the result's norm
  double abs_tol = 1e-6;
  double norm_tol = 1e-5;    // relative: a declared result norm must match its values
  double report_tol = 1e-6;  // relative: a report must match the values it was computed from
  // The run's AggregationConfig (apply_aggregation): a CenteredClip result must use
  // tau == fixed_tau (> 0), or (adaptive) tau >= tau_slack x tau_scale x the median of the
  // members' distances to it; with a cut, members count clip_coef(d, tau, cut) and more than
  // half of them must count (> 0).
  double max_weight_ratio = 1.0;
  double fixed_tau = 0;
  double tau_scale = 1.0;
  double tau_slack = 0.5;
  double cut = AggregationConfig{}.cut;  // effective_cut() of the run's aggregation
};
// Copies the run's aggregation parameters into `check`.
void apply_aggregation(CheckConfig& check, const AggregationConfig& agg);

// The round's seed: BLAKE2b over the round id and the nonces in member order.
Hash32 round_seed(const Hash32& round, std::span<const Hash32> nonces);
// z for one part: count values of +-1 drawn from (seed, subround, part).
void projection_vector(const Hash32& seed, std::uint32_t subround, std::uint32_t part,
                       std::span<float> z);
struct Projection {
  double proj = 0;
  double dist = 0;
};
// <z, g - r> and |g - r| (summed in double, in index order).
Projection project(const Hash32& seed, std::uint32_t subround, std::uint32_t part,
                   std::span<const float> g, std::span<const float> r);
// The statistic sum_i w_i c_i p_i / sum_i w_i c_i and its bound; with `clip`, weights capped
// like the owner's and c_i = clip_coef(d_i, tau, cfg.cut) (robust.hpp: min(1, tau/d_i),
// tapered to 0 at the cut), else weights as given and c_i = 1. With a cut, a radius under
// which half the members or more count 0 is implausible (tau_ok false).
struct FixedPointCheck {
  double statistic = 0;
  double bound = 0;
  bool tau_ok = true;  // the declared tau is plausible (see CheckConfig)
  bool ok() const { return tau_ok && std::abs(statistic) <= bound; }
};
FixedPointCheck check_fixed_point(std::span<const ProjectionReport> reports, bool clip, double tau,
                                  double result_norm, const CheckConfig& cfg);

// The owner's side. |sum_i w_i c_i (g_i - r)| / sum_i w_i c_i: the full residual whose
// projection the members check (clip: CenteredClip's with radius tau and cut; else the
// mean's).
double fixed_point_residual(std::span<const float> result,
                            const std::vector<std::span<const float>>& inputs,
                            std::span<const double> weights, bool clip, double tau,
                            double max_weight_ratio, double cut);
// CenteredClip (robust.hpp) with its iteration limit doubled until the residual is within
// check.rel_tol x |result| (at most max_iterations_cap), so an honest owner passes the
// aggregation check. Returns the stats of the last run and the residual.
struct CheckedClip {
  ClipStats stats;
  double residual = 0;
  bool within = false;
};
CheckedClip centered_clip_checked(std::span<float> out,
                                  const std::vector<std::span<const float>>& inputs,
                                  std::span<const double> weights, AggregationConfig cfg,
                                  const CheckConfig& check,
                                  std::uint32_t max_iterations_cap = 1280);

// --- evidence ---
enum class EvidenceKind : std::uint8_t {
  commitment_conflict = 1,
  part_mismatch = 2,
  receipt_conflict = 3,
  bad_result_norm = 4,
  wrong_average = 5,
  false_report = 6,
  report_conflict = 7,
};
const char* to_string(EvidenceKind k);

struct Evidence {
  EvidenceKind kind = EvidenceKind::commitment_conflict;
  RoundInfo info;  // the round: its statements name round_id(info), signed by its members
  std::vector<Commitment> commitments;    // commitment_conflict: 2; part_mismatch: 1
  std::vector<DataReceipt> receipts;      // part_mismatch: the part; receipt_conflict: 2;
                                          // bad_result_norm, wrong_average: the result;
                                          // false_report: the part, then the result
  std::vector<Reveal> reveals;            // wrong_average, false_report: every member's
  std::vector<ProjectionReport> reports;  // wrong_average: every counted member's; false_report: 1;
                                          // report_conflict: 2
  std::vector<float> data;                // bad_result_norm: the result; false_report: the part
  std::vector<float> data2;               // false_report: the result
  friend bool operator==(const Evidence&, const Evidence&) = default;
};
Bytes encode(const Evidence& e);
result<Evidence> decode_evidence(BytesView b);

struct Verdict {
  PubKey guilty{};
  EvidenceKind kind = EvidenceKind::commitment_conflict;
  Hash32 round{};
  std::uint32_t subround = 0;
  std::uint32_t part = 0;
  // wrong_average: a member may have lied; the owner has a grace period to answer with
  // false_report evidence for the same (round, subround, part).
  bool pending = false;
};
// Checks every signature and relation; errors (errc::invalid_argument) say why the evidence
// proves nothing.
result<Verdict> verify_evidence(const Evidence& e, const CheckConfig& cfg);

// Builders used by members (the caller supplies statements it verified when it got them).
Evidence commitment_conflict(const RoundInfo& info, const Commitment& a, const Commitment& b);
Evidence part_mismatch(const RoundInfo& info, const Commitment& c, const DataReceipt& part);
Evidence receipt_conflict(const RoundInfo& info, const DataReceipt& a, const DataReceipt& b);
Evidence report_conflict(const RoundInfo& info, const ProjectionReport& a,
                         const ProjectionReport& b);

}  // namespace starling::averaging::acct

namespace starling::averaging::acct {

// The commitments one member holds for a round, received from their senders or relayed by
// other members. A sender that commits differently to different members is caught when the
// members compare digests (each reports the digest it holds per sender, e.g. in its fin
// report) and one relays its copy to a member whose digest differs: add() then returns
// commitment_conflict evidence.
class CommitmentLedger {
 public:
  explicit CommitmentLedger(RoundInfo info) : info_(std::move(info)), round_(round_id(info_)) {}
  // Errors: not a valid commitment of this round by that member (check_commitment()).
  // Returns evidence when it conflicts with the one held for (sub-round, sender).
  result<std::optional<Evidence>> add(const Commitment& c);
  const Commitment* get(std::uint32_t subround, std::uint32_t sender) const;
  std::optional<Hash32> digest(std::uint32_t subround, std::uint32_t sender) const;
  // True iff we hold a commitment for (subround, sender) whose digest is not `other`.
  bool differs(std::uint32_t subround, std::uint32_t sender, const Hash32& other) const;

 private:
  RoundInfo info_;
  Hash32 round_;
  std::map<std::pair<std::uint32_t, std::uint32_t>, Commitment> held_;
};

}  // namespace starling::averaging::acct
