// MatchmakingCore: one peer's side of forming one averaging group, as a protocol core that does
// no I/O and takes (wall-clock) time as a parameter. The networked matchmaker publishes this
// peer's MatchEntry in the DHT dictionary of its group key, feeds back what it reads there
// (on_view), carries the messages over join streams, and reports stream failures.
//
// Rule (no coordinator, no waiting cycles). Every peer orders the open entries of its view that
// share its schema hash: non-clients first, each class by BLAKE2b(peer id, key); it splits them
// into G = ceil(P / target) groups (fewer if groups would fall below the minimum), led by the
// first G non-clients (existing leaders first), the rest dealt to the least loaded group
// (plan_groups()). Peers plan only after a settle time, so that the first views are complete
// (or, with a hint, once the view shows every expected peer). A
// peer whose plan names another leader sends it a JoinRequest. A leader accepts while it is not
// itself joining or following anyone, has room, and the schema and key match; it never waits on
// anyone, so there are no cycles of waiting peers. A peer that is joining or following rejects
// joins at once ("busy"). A rejected peer avoids that leader for a while and replans from its view.
// The leader begins when the group is full, or when it has at least the minimum, has waited
// min_wait (or, with a hint, holds expected_size members: every peer the caller expects), and
// no open peer in its view is still planned to join it, or at the earliest deadline of its
// members. Begin -> every follower answers Confirm -> the leader sends Start
// with the final member list (only confirmed followers) -> done. A follower that confirmed
// one Begin accepts no other leader, so no peer is in two groups. Any peer whose deadline
// passes without a group ends with errc::timeout and a reason (peers seen, group sizes).
//
// Threading rule: single-threaded (the node's I/O thread).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "starling/averaging/group_key.hpp"
#include "starling/averaging/types.hpp"
#include "starling/core/clock.hpp"

namespace starling::averaging {

// What a peer publishes under its group key (DHT dictionary: sub-key = peer id, expiring at
// the deadline).
struct MatchEntry {
  MemberInfo info;  // peer, addrs, bandwidth, client (weight is sent in the JoinRequest)
  Bytes schema_hash;
  WallTime deadline;             // the group must begin by then
  bool open = true;              // false once following or leading a full group
  std::uint32_t group_size = 1;  // a leader's current group size (itself + followers)
  friend bool operator==(const MatchEntry&, const MatchEntry&) = default;
};

struct JoinRequest {
  MemberInfo member;  // with the weight for this round
  Bytes schema_hash;
  std::string group_key;
  WallTime deadline;
};
enum class JoinVerdict : std::uint8_t {
  accepted = 0,
  busy = 1,  // joining or following someone else
  full = 2,
  begun = 3,  // already began (or finished) this round
  schema_mismatch = 4,
  key_mismatch = 5,
  not_leader = 6,    // a client-mode peer cannot lead
  expired = 7,       // the request's deadline already passed
  not_admitted = 8,  // not a member of this private run (AveragerConfig::gate)
  banned = 9,        // the leader holds evidence against the requester (accountability)
};
struct JoinReply {
  JoinVerdict verdict = JoinVerdict::accepted;
};
struct BeginMsg {  // leader -> follower
  Bytes group_id;
};
struct ConfirmMsg {  // follower -> leader
  Bytes group_id;
};
struct StartMsg {  // leader -> confirmed followers
  GroupInfo group;
};
struct DisbandMsg {  // leader -> followers: the group will not form; replan
  std::string reason;
};
struct LeaveMsg {};  // follower -> leader: not waiting any more
using MatchMessage =
    std::variant<JoinRequest, BeginMsg, ConfirmMsg, StartMsg, DisbandMsg, LeaveMsg>;

struct MatchOut {
  PeerKey to;
  MatchMessage msg;
};

// How often a looking peer with an expected-size hint re-reads the DHT while settling.
inline constexpr Duration kSettlePoll = std::chrono::milliseconds(50);

struct MatchmakingConfig {
  std::size_t target_group_size = 16;
  std::size_t min_group_size = 2;
  Duration settle = 1s;            // read the DHT this long before the first join decision
  Duration min_wait = 2s;          // a leader does not begin short of full before this
  Duration join_timeout = 5s;      // a JoinRequest without reply counts as rejected
  Duration confirm_timeout = 3s;   // leader waiting for Confirms / follower waiting for Start
  Duration refresh_interval = 1s;  // how often to re-read the DHT view
  Duration reject_backoff = 3s;    // do not ask a leader that rejected us again before this
  // Per-step hint (StepOptions::expected_group_size; 0: none): the number of peers expected in
  // this round, this one included. A leader whose group has at least this many members (and
  // min_group_size) begins without waiting min_wait, unless an open peer of its view is still
  // planned to join it. A looking peer whose view shows this many peers (entries of its schema,
  // itself included) plans at once instead of after settle, and re-reads the DHT every
  // kSettlePoll until then. The caller must not count low: a peer that joins after the leader
  // began is left out of the round.
  std::size_t expected_size = 0;
  // Peers never grouped with (accountability's bans): left out of the view, their join
  // requests refused (JoinVerdict::banned). Empty: nobody.
  std::function<bool(const PeerKey&)> excluded;
};

// The plan for one view: for each planned group, its leader followed by its members. Groups
// that already have a leader (group_size > 1) lead first; the other peers go, in rank order,
// to the least loaded planned group with room; planned groups below `min` are dropped.
std::vector<std::vector<PeerKey>> plan_groups(const std::vector<MatchEntry>& open_entries,
                                              const std::string& group_key, std::size_t target,
                                              std::size_t min);

class MatchmakingCore {
 public:
  enum class State { looking, joining, following, confirmed, leading, beginning, done, failed };

  // `self.info.weight` is this round's weight. `deadline`: the group must begin by then.
  MatchmakingCore(MatchmakingConfig cfg, MemberInfo self, Bytes schema_hash, GroupKey key,
                  WallTime now, WallTime deadline, std::uint64_t seed);

  // The entry to publish under key().dht_key() now (changes when `open` changes).
  const MatchEntry& entry() const noexcept { return entry_; }
  // True when entry() changed since the last call (the driver republishes).
  bool take_republish();

  void on_view(const std::vector<MatchEntry>& entries, WallTime now);
  JoinReply on_join(const JoinRequest& req, WallTime now);
  void on_join_reply(const PeerKey& from, JoinReply reply, WallTime now);
  void on_message(const PeerKey& from, const MatchMessage& msg, WallTime now);
  void on_peer_failed(const PeerKey& peer, WallTime now);
  void tick(WallTime now);
  // This peer stops looking for a group (its step was cancelled): a follower tells its leader
  // (Leave), a leader releases its followers (Disband), and the core fails with
  // errc::cancelled at once. No effect once done or failed.
  void cancel(WallTime now, const std::string& why);

  std::vector<MatchOut> take_outbox();
  // Earliest time after `now` at which tick() has something to do.
  WallTime next_wakeup(WallTime now) const;
  // The driver should re-read the DHT and call on_view() (at most every refresh_interval).
  bool wants_view(WallTime now) const;

  State state() const noexcept { return state_; }
  const GroupInfo& group() const noexcept { return group_; }  // valid in state done
  const Error& error() const noexcept { return error_; }      // valid in state failed
  const GroupKey& key() const noexcept { return key_; }
  const std::optional<PeerKey>& leader() const noexcept { return leader_; }
  static const char* state_name(State s);

 private:
  struct Follower {
    MemberInfo info;
    WallTime deadline;
    bool confirmed = false;
  };
  void replan(WallTime now);
  void maybe_begin(WallTime now);
  // Whether an open peer of the view is planned to join this leader but has not yet.
  bool awaiting_planned(WallTime now) const;
  bool expected_in_view(WallTime now) const;
  bool settling(WallTime now) const;
  Duration refresh_interval(WallTime now) const;
  bool merge_into_planned(WallTime now);
  void finalize(WallTime now);
  void back_to_looking(WallTime now);
  void set_open(bool open);
  void update_size();
  void fail(errc code, std::string why);
  WallTime begin_by() const;
  std::vector<MatchEntry> eligible(WallTime now) const;

  MatchmakingConfig cfg_;
  MemberInfo self_;
  Bytes schema_hash_;
  GroupKey key_;
  WallTime started_, deadline_;
  MatchEntry entry_;
  bool republish_ = true;
  State state_ = State::looking;
  std::map<PeerKey, MatchEntry> view_;
  WallTime last_view_{};
  bool have_view_ = false;
  std::map<PeerKey, WallTime> avoid_until_;
  std::optional<PeerKey> leader_;
  WallTime state_since_{};
  std::vector<Follower> followers_;
  Bytes group_id_;
  GroupInfo group_;
  Error error_;
  std::vector<MatchOut> outbox_;
  std::uint64_t rng_state_;
  std::size_t max_seen_ = 0, max_same_schema_ = 0;
};

}  // namespace starling::averaging
