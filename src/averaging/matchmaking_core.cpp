#include "starling/averaging/matchmaking_core.hpp"

#include <algorithm>
#include <tuple>

#include "starling/averaging/schema.hpp"
#include "starling/core/log.hpp"

namespace starling::averaging {
namespace {

std::uint64_t rank_of(const PeerKey& p, const std::string& key) {
  Bytes b = p.bytes();
  b.push_back(0);
  b.insert(b.end(), key.begin(), key.end());
  const Bytes h = blake2b_256(b);
  std::uint64_t r = 0;
  for (int i = 0; i < 8; ++i) r = (r << 8) | h[i];
  return r;
}

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The group of the plan over `entries` that holds `self`, its leader first (empty if none).
std::vector<PeerKey> group_of(const std::vector<MatchEntry>& entries, const GroupKey& key,
                              const MatchmakingConfig& cfg, const PeerKey& self) {
  for (auto& g : plan_groups(entries, key.to_string(), cfg.target_group_size, cfg.min_group_size))
    if (std::find(g.begin(), g.end(), self) != g.end()) return std::move(g);
  return {};
}

std::string ms(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

}  // namespace

std::vector<std::vector<PeerKey>> plan_groups(const std::vector<MatchEntry>& open_entries,
                                              const std::string& group_key, std::size_t target,
                                              std::size_t min) {
  struct Cand {
    bool fresh;  // not leading yet
    std::uint64_t rank;
    PeerKey peer;
    std::size_t size;
    bool operator<(const Cand& o) const {
      return std::tie(fresh, rank, peer) < std::tie(o.fresh, o.rank, o.peer);
    }
  };
  std::vector<Cand> leaders_pool, clients;
  std::size_t p = 0;
  for (const auto& e : open_entries) {
    const std::size_t size = e.info.client ? 1 : std::clamp<std::size_t>(e.group_size, 1, target);
    (e.info.client ? clients : leaders_pool)
        .push_back({size <= 1, rank_of(e.info.peer, group_key), e.info.peer, size});
    p += size;
  }
  std::sort(leaders_pool.begin(), leaders_pool.end());
  std::sort(clients.begin(), clients.end());
  if (leaders_pool.empty() || p < std::max<std::size_t>(min, 1) || target == 0) return {};
  std::size_t g = std::min((p + target - 1) / target, leaders_pool.size());
  while (g > 1 && p / g < min) --g;
  std::vector<std::vector<PeerKey>> groups(g);
  std::vector<std::size_t> load(g);
  for (std::size_t i = 0; i < g; ++i) {
    groups[i].push_back(leaders_pool[i].peer);
    load[i] = leaders_pool[i].size;
  }
  std::vector<const Cand*> rest;
  for (std::size_t i = g; i < leaders_pool.size(); ++i) rest.push_back(&leaders_pool[i]);
  for (auto& c : clients) rest.push_back(&c);
  for (const Cand* c : rest) {
    std::size_t best = g;
    for (std::size_t i = 0; i < g; ++i)
      if (load[i] + c->size <= target && (best == g || load[i] < load[best])) best = i;
    if (best == g) continue;  // no room: wait for a later plan
    groups[best].push_back(c->peer);
    load[best] += c->size;
  }
  std::vector<std::vector<PeerKey>> out;
  for (std::size_t i = 0; i < g; ++i)
    if (load[i] >= min) out.push_back(std::move(groups[i]));
  return out;
}

MatchmakingCore::MatchmakingCore(MatchmakingConfig cfg, MemberInfo self, Bytes schema_hash,
                                 GroupKey key, WallTime now, WallTime deadline, std::uint64_t seed)
    : cfg_(cfg),
      self_(std::move(self)),
      schema_hash_(std::move(schema_hash)),
      key_(std::move(key)),
      started_(now),
      deadline_(deadline),
      state_since_(now),
      rng_state_(seed) {
  entry_.info = self_;
  entry_.info.weight = 0;  // weights travel in JoinRequests, not in the DHT
  entry_.schema_hash = schema_hash_;
  entry_.deadline = deadline_;
  entry_.open = true;
  if (cfg_.min_group_size < 1) cfg_.min_group_size = 1;
  if (cfg_.target_group_size < cfg_.min_group_size) cfg_.target_group_size = cfg_.min_group_size;
  if (cfg_.target_group_size > kMaxGroupSize) cfg_.target_group_size = kMaxGroupSize;
}

const char* MatchmakingCore::state_name(State s) {
  switch (s) {
    case State::looking:
      return "looking";
    case State::joining:
      return "joining";
    case State::following:
      return "following";
    case State::confirmed:
      return "confirmed";
    case State::leading:
      return "leading";
    case State::beginning:
      return "beginning";
    case State::done:
      return "done";
    case State::failed:
      return "failed";
  }
  return "?";
}

bool MatchmakingCore::take_republish() {
  return std::exchange(republish_, false);
}

void MatchmakingCore::update_size() {
  const auto size = static_cast<std::uint32_t>(
      state_ == State::leading || state_ == State::beginning ? followers_.size() + 1 : 1);
  if (entry_.group_size == size) return;
  entry_.group_size = size;
  republish_ = true;
}

void MatchmakingCore::set_open(bool open) {
  if (entry_.open == open) return;
  entry_.open = open;
  republish_ = true;
}

std::vector<MatchOut> MatchmakingCore::take_outbox() {
  return std::exchange(outbox_, {});
}

void MatchmakingCore::fail(errc code, std::string why) {
  if (state_ == State::done || state_ == State::failed) return;
  state_ = State::failed;
  error_ = make_error(code, "matchmaking under " + key_.to_string() + ": " + why);
  set_open(false);
  logger("averaging")->info("{}", error_.message());
}

std::vector<MatchEntry> MatchmakingCore::eligible(WallTime now) const {
  std::vector<MatchEntry> out;
  bool have_self = false;
  for (const auto& [peer, e] : view_) {
    if (peer == self_.peer) {
      have_self = true;
      continue;
    }
    if (!e.open || e.schema_hash != schema_hash_ || e.deadline <= now) continue;
    if (auto it = avoid_until_.find(peer); it != avoid_until_.end() && it->second > now) continue;
    out.push_back(e);
  }
  (void)have_self;
  MatchEntry me = entry_;
  me.open = true;
  out.push_back(me);
  return out;
}

void MatchmakingCore::on_view(const std::vector<MatchEntry>& entries, WallTime now) {
  view_.clear();
  std::size_t same = 0;
  for (const auto& e : entries) {
    if (e.info.peer.empty()) continue;
    if (cfg_.excluded && cfg_.excluded(e.info.peer)) continue;
    view_[e.info.peer] = e;
    if (e.schema_hash == schema_hash_) ++same;
  }
  max_seen_ = std::max(max_seen_, view_.size());
  max_same_schema_ = std::max(max_same_schema_, same);
  last_view_ = now;
  have_view_ = true;
  if (state_ == State::looking) replan(now);
  if (state_ == State::leading) maybe_begin(now);
  // Below the minimum, a fresh view may show another leader this one's group belongs under.
  if (state_ == State::leading && followers_.size() + 1 < cfg_.min_group_size)
    merge_into_planned(now);
}

bool MatchmakingCore::expected_in_view(WallTime now) const {
  if (cfg_.expected_size == 0) return false;
  std::size_t n = 1;  // this peer
  for (const auto& [peer, e] : view_)
    if (peer != self_.peer && e.schema_hash == schema_hash_ && e.deadline > now) ++n;
  return n >= cfg_.expected_size;
}

bool MatchmakingCore::settling(WallTime now) const {
  return now - started_ < cfg_.settle && !expected_in_view(now);
}

Duration MatchmakingCore::refresh_interval(WallTime now) const {
  // While settling with a hint, poll faster: planning starts once every expected peer shows.
  if (state_ == State::looking && cfg_.expected_size > 0 && settling(now))
    return std::min<Duration>(cfg_.refresh_interval, kSettlePoll);
  return cfg_.refresh_interval;
}

bool MatchmakingCore::wants_view(WallTime now) const {
  if (state_ != State::looking && state_ != State::leading) return false;
  return !have_view_ || now - last_view_ >= refresh_interval(now);
}

void MatchmakingCore::replan(WallTime now) {
  // The settle time lets the first views fill up; a view that already shows every peer the
  // caller expects is as complete as waiting would make it.
  if (state_ != State::looking || !have_view_ || settling(now)) return;
  const auto g = group_of(eligible(now), key_, cfg_, self_.peer);
  if (g.empty() || g.front() == self_.peer) return;  // unplanned, or the leader: wait for joins
  leader_ = g.front();
  state_ = State::joining;
  state_since_ = now;
  outbox_.push_back({g.front(), JoinRequest{self_, schema_hash_, key_.to_string(), deadline_}});
}

JoinReply MatchmakingCore::on_join(const JoinRequest& req, WallTime now) {
  auto reply = [](JoinVerdict v) { return JoinReply{v}; };
  if (req.schema_hash != schema_hash_) return reply(JoinVerdict::schema_mismatch);
  if (req.group_key != key_.to_string()) return reply(JoinVerdict::key_mismatch);
  if (req.deadline <= now) return reply(JoinVerdict::expired);
  if (self_.client) return reply(JoinVerdict::not_leader);
  if (cfg_.excluded && cfg_.excluded(req.member.peer)) return reply(JoinVerdict::banned);
  switch (state_) {
    case State::joining:
    case State::following:
    case State::confirmed:
      return reply(JoinVerdict::busy);
    case State::beginning:
    case State::done:
    case State::failed:
      return reply(JoinVerdict::begun);
    case State::looking:
    case State::leading:
      break;
  }
  if (req.member.peer == self_.peer) return reply(JoinVerdict::busy);
  for (const auto& f : followers_)
    if (f.info.peer == req.member.peer) return reply(JoinVerdict::accepted);  // a retry
  if (followers_.size() + 1 >= cfg_.target_group_size) return reply(JoinVerdict::full);
  followers_.push_back({req.member, req.deadline, false});
  if (state_ == State::looking) {
    state_ = State::leading;
    state_since_ = now;
  }
  if (followers_.size() + 1 >= cfg_.target_group_size) set_open(false);
  update_size();
  maybe_begin(now);
  return reply(JoinVerdict::accepted);
}

void MatchmakingCore::on_join_reply(const PeerKey& from, JoinReply reply, WallTime now) {
  if (state_ != State::joining || !leader_ || *leader_ != from) return;
  if (reply.verdict == JoinVerdict::accepted) {
    state_ = State::following;
    state_since_ = now;
    set_open(false);
    return;
  }
  avoid_until_[from] = now + cfg_.reject_backoff;
  leader_.reset();
  state_ = State::looking;
  state_since_ = now;
  replan(now);
}

WallTime MatchmakingCore::begin_by() const {
  WallTime t = deadline_;
  for (const auto& f : followers_) t = std::min(t, f.deadline);
  return t;
}

bool MatchmakingCore::awaiting_planned(WallTime now) const {
  const auto g = group_of(eligible(now), key_, cfg_, self_.peer);
  if (g.empty() || g.front() != self_.peer) return false;
  std::set<PeerKey> mine{self_.peer};
  for (const auto& f : followers_) mine.insert(f.info.peer);
  for (const auto& p : g)
    if (!mine.count(p)) return true;
  return false;
}

void MatchmakingCore::maybe_begin(WallTime now) {
  if (state_ != State::leading) return;
  const std::size_t size = followers_.size() + 1;
  bool go = size >= cfg_.target_group_size;
  if (!go && size >= cfg_.min_group_size) {
    const bool expected_all = cfg_.expected_size > 0 && size >= cfg_.expected_size;
    if (now >= begin_by())
      go = true;
    else if (expected_all || now - started_ >= cfg_.min_wait)
      go = !awaiting_planned(now);
  }
  if (!go) {
    if (now >= begin_by()) {
      // Too few peers by the earliest deadline: release the followers.
      for (const auto& f : followers_)
        outbox_.push_back(
            {f.info.peer, DisbandMsg{"only " + std::to_string(size) + " peers gathered, minimum " +
                                     std::to_string(cfg_.min_group_size)}});
      followers_.clear();
      back_to_looking(now);
    }
    return;
  }
  group_id_.resize(16);
  for (std::size_t i = 0; i < 16; i += 8) {
    const std::uint64_t r = splitmix(rng_state_);
    for (std::size_t j = 0; j < 8; ++j) group_id_[i + j] = static_cast<std::uint8_t>(r >> (8 * j));
  }
  state_ = State::beginning;
  state_since_ = now;
  set_open(false);
  for (const auto& f : followers_) outbox_.push_back({f.info.peer, BeginMsg{group_id_}});
  if (followers_.empty()) finalize(now);
}

// Two peers that planned from different views can both lead, each with part of the peers and
// neither with the minimum: each would wait for the other's followers until the deadline (seen:
// 15 s stalls with 4 peers, minimum 3, every few rounds). Once this leader's view plans its
// group under another leader, it hands its followers back (they replan and join that leader)
// and joins it itself. The plan orders leaders by (gathered a group, rank), so two leaders that
// see each other's sizes agree on which one gives way; stale sizes only delay the merge.
bool MatchmakingCore::merge_into_planned(WallTime now) {
  const auto g = group_of(eligible(now), key_, cfg_, self_.peer);
  if (g.empty() || g.front() == self_.peer) return false;
  const PeerKey& other = g.front();
  logger("averaging")
      ->debug("leader of {} (minimum {}) merges into the group of {}", followers_.size() + 1,
              cfg_.min_group_size, other.short_hex());
  for (const auto& f : followers_)
    outbox_.push_back({f.info.peer, DisbandMsg{"merging into the group of " + other.short_hex()}});
  followers_.clear();
  leader_ = other;
  state_ = State::joining;
  state_since_ = now;
  update_size();
  outbox_.push_back({other, JoinRequest{self_, schema_hash_, key_.to_string(), deadline_}});
  return true;
}

void MatchmakingCore::finalize(WallTime now) {
  std::vector<MemberInfo> members{self_};
  for (const auto& f : followers_)
    if (f.confirmed) members.push_back(f.info);
  if (members.size() < cfg_.min_group_size) {
    for (const auto& f : followers_)
      if (f.confirmed) outbox_.push_back({f.info.peer, DisbandMsg{"too few followers confirmed"}});
    followers_.clear();
    back_to_looking(now);
    return;
  }
  std::sort(members.begin(), members.end(),
            [](const MemberInfo& a, const MemberInfo& b) { return a.peer < b.peer; });
  group_.group_id = group_id_;
  group_.members = members;
  group_.schema_hash = schema_hash_;
  for (const auto& m : members)
    if (m.peer != self_.peer) outbox_.push_back({m.peer, StartMsg{group_}});
  state_ = State::done;
  state_since_ = now;
}

void MatchmakingCore::back_to_looking(WallTime now) {
  leader_.reset();
  followers_.clear();
  state_ = State::looking;
  update_size();
  if (now >= deadline_) {
    fail(errc::timeout, "no group of at least " + std::to_string(cfg_.min_group_size) +
                            " formed before the deadline (saw up to " +
                            std::to_string(max_same_schema_) + " peers with this schema, " +
                            std::to_string(max_seen_) + " in all)");
    return;
  }
  state_ = State::looking;
  state_since_ = now;
  set_open(true);
  replan(now);
}

void MatchmakingCore::on_message(const PeerKey& from, const MatchMessage& msg, WallTime now) {
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, BeginMsg>) {
          // A Begin before the JoinReply implies acceptance.
          if (state_ == State::joining && leader_ == from)
            set_open(false);
          else if (state_ != State::following || leader_ != from)
            return;
          state_ = State::confirmed;
          state_since_ = now;
          group_id_ = m.group_id;
          outbox_.push_back({from, ConfirmMsg{m.group_id}});
        } else if constexpr (std::is_same_v<T, ConfirmMsg>) {
          if (state_ != State::beginning || m.group_id != group_id_) return;
          bool all = true;
          for (auto& f : followers_) {
            if (f.info.peer == from) f.confirmed = true;
            all = all && f.confirmed;
          }
          if (all) finalize(now);
        } else if constexpr (std::is_same_v<T, StartMsg>) {
          if (state_ != State::confirmed || leader_ != from || m.group.group_id != group_id_)
            return;
          if (!m.group.index_of(self_.peer) || m.group.schema_hash != schema_hash_ ||
              !validate_members(m.group.members)) {
            fail(errc::protocol_violation, "leader sent an invalid group");
            return;
          }
          group_ = m.group;
          state_ = State::done;
          state_since_ = now;
        } else if constexpr (std::is_same_v<T, DisbandMsg>) {
          if ((state_ != State::following && state_ != State::confirmed) || leader_ != from) return;
          logger("averaging")->debug("leader {} disbanded: {}", from.short_hex(), m.reason);
          avoid_until_[from] = now + cfg_.reject_backoff;
          back_to_looking(now);
        } else if constexpr (std::is_same_v<T, LeaveMsg>) {
          if (state_ != State::leading && state_ != State::beginning) return;
          on_peer_failed(from, now);
        } else if constexpr (std::is_same_v<T, JoinRequest>) {
          // Join requests arrive through on_join (they need a synchronous reply).
        }
      },
      msg);
}

void MatchmakingCore::on_peer_failed(const PeerKey& peer, WallTime now) {
  if ((state_ == State::joining || state_ == State::following) && leader_ == peer) {
    avoid_until_[peer] = now + cfg_.reject_backoff;
    back_to_looking(now);
    return;
  }
  if (state_ == State::confirmed && leader_ == peer) {
    fail(errc::unavailable, "leader " + peer.short_hex() + " vanished after beginning the group");
    return;
  }
  if (state_ == State::leading || state_ == State::beginning) {
    const auto before = followers_.size();
    std::erase_if(followers_, [&](const Follower& f) { return f.info.peer == peer; });
    if (followers_.size() == before) return;
    if (state_ == State::leading) {
      set_open(true);
      update_size();
      if (followers_.empty()) back_to_looking(now);
    } else {
      bool all = std::all_of(followers_.begin(), followers_.end(),
                             [](const Follower& f) { return f.confirmed; });
      if (all) finalize(now);
    }
  }
}

void MatchmakingCore::cancel(WallTime now, const std::string& why) {
  (void)now;
  switch (state_) {
    case State::joining:
    case State::following:
    case State::confirmed:
      // A confirmed follower's leader either drops it before Start (Leave) or, if it started
      // already, the round treats this peer as lost.
      if (leader_) outbox_.push_back({*leader_, LeaveMsg{}});
      break;
    case State::leading:
    case State::beginning:
      for (const auto& f : followers_)
        outbox_.push_back({f.info.peer, DisbandMsg{"the leader left: " + why}});
      followers_.clear();
      break;
    case State::looking:
      break;
    case State::done:
    case State::failed:
      return;
  }
  leader_.reset();
  fail(errc::cancelled, why);
}

void MatchmakingCore::tick(WallTime now) {
  switch (state_) {
    case State::looking:
      if (now >= deadline_)
        back_to_looking(now);
      else if (now - started_ >= cfg_.settle)
        replan(now);
      break;
    case State::joining:
      if (now - state_since_ >= cfg_.join_timeout || now >= deadline_) {
        if (leader_) {
          avoid_until_[*leader_] = now + cfg_.reject_backoff;
          outbox_.push_back({*leader_, LeaveMsg{}});
        }
        back_to_looking(now);
      }
      break;
    case State::following:
      // The leader begins by our deadline at the latest; allow it one confirm timeout.
      if (now >= deadline_ + cfg_.confirm_timeout) {
        if (leader_) outbox_.push_back({*leader_, LeaveMsg{}});
        fail(errc::timeout, "leader " + (leader_ ? leader_->short_hex() : std::string("?")) +
                                " did not begin before the deadline");
      }
      break;
    case State::confirmed:
      // The leader waits up to confirm_timeout for the other confirms: allow twice that.
      if (now - state_since_ >= 2 * cfg_.confirm_timeout)
        fail(errc::timeout, "leader did not start the group within " +
                                ms(2 * cfg_.confirm_timeout) + " of beginning it");
      break;
    case State::leading:
      maybe_begin(now);
      break;
    case State::beginning:
      if (now - state_since_ >= cfg_.confirm_timeout) finalize(now);
      break;
    case State::done:
    case State::failed:
      break;
  }
}

WallTime MatchmakingCore::next_wakeup(WallTime now) const {
  std::vector<WallTime> c;
  switch (state_) {
    case State::looking:
      c = {deadline_, last_view_ + refresh_interval(now), started_ + cfg_.settle};
      break;
    case State::joining:
      c = {deadline_, state_since_ + cfg_.join_timeout};
      break;
    case State::following:
      c = {deadline_ + cfg_.confirm_timeout};
      break;
    case State::confirmed:
      c = {state_since_ + 2 * cfg_.confirm_timeout};
      break;
    case State::beginning:
      c = {state_since_ + cfg_.confirm_timeout};
      break;
    case State::leading:
      c = {begin_by(), last_view_ + cfg_.refresh_interval, started_ + cfg_.min_wait};
      break;
    case State::done:
    case State::failed:
      return WallTime::max();
  }
  WallTime best = WallTime::max();
  for (auto t : c)
    if (t > now) best = std::min(best, t);
  // Everything due is already past (the caller is behind): poll again shortly.
  return best == WallTime::max() ? now + std::min(cfg_.refresh_interval, Duration(100ms)) : best;
}

}  // namespace starling::averaging
