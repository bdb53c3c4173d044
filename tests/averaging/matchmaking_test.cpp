// Matchmaking core: plan_groups() properties, group keys, and a deterministic simulation of
// many peers over a simulated eventually-consistent DHT and a delaying network, with random
// joins, leaves and crashes, checking the invariants round after round.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "starling/averaging/matchmaking_core.hpp"
#include "starling/averaging/schema.hpp"

using namespace starling;
using namespace starling::averaging;

namespace {

PeerKey pk(int i) {
  return PeerKey::from_string("peer-" + std::to_string(i));
}

MatchEntry entry(int i, bool client = false) {
  MatchEntry e;
  e.info.peer = pk(i);
  e.info.bandwidth = 1000;
  e.info.client = client;
  e.schema_hash = Bytes(32, 1);
  e.deadline = WallTime{} + 24h;
  return e;
}

// --- the simulation ---

struct SimPeer {
  int id = 0;
  bool alive = true;
  bool client = false;
  int schema = 0;
  GroupKey key;
  std::unique_ptr<MatchmakingCore> mm;
  WallTime started{};
  WallTime ended{};
  std::optional<WallTime> wake;
};

struct Published {
  MatchEntry e;
  WallTime at;
};

class MatchSim {
 public:
  MatchSim(MatchmakingConfig cfg, GroupKeyConfig kcfg, std::uint64_t seed)
      : cfg_(cfg), kcfg_(kcfg), rng_(seed) {}

  int add_peer(bool client, int schema) {
    auto p = std::make_unique<SimPeer>();
    p->id = static_cast<int>(peers_.size());
    p->client = client;
    p->schema = schema;
    p->key = GroupKey::initial(kcfg_, rng_()).value();
    peers_.push_back(std::move(p));
    return peers_.back()->id;
  }
  SimPeer& peer(int i) { return *peers_[i]; }
  std::size_t size() const { return peers_.size(); }
  WallTime now() const { return now_; }

  // Starts a matchmaking round for every live peer (start jitter up to `jitter`), each with
  // `budget` until its deadline, kills `kill_frac` of the peers at random times during the
  // round, and runs until every started peer has an outcome.
  void round(Duration budget, Duration jitter, double kill_frac = 0) {
    started_.clear();
    const WallTime t0 = now_;
    for (auto& p : peers_) {
      if (!p->alive) continue;
      p->mm.reset();
      p->wake.reset();
      const auto at =
          t0 +
          std::chrono::milliseconds(
              jitter.count()
                  ? rng_() % std::chrono::duration_cast<std::chrono::milliseconds>(jitter).count()
                  : 0);
      started_.push_back(p->id);
      push(at, [this, id = p->id, budget] { start_peer(id, budget); });
      if (kill_frac > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < kill_frac) {
        const auto when = t0 + std::chrono::milliseconds(rng_() % 4000);
        push(when, [this, id = p->id] { kill(id); });
      }
    }
    const WallTime limit = t0 + jitter + budget + 20s;
    while (!events_.empty()) {
      auto it = events_.begin();
      if (it->first.first > limit) break;
      now_ = it->first.first;
      auto fn = std::move(it->second);
      events_.erase(it);
      fn();
    }
    events_.clear();
    now_ = limit;
  }
  const std::vector<int>& started() const { return started_; }

  void kill(int id) {
    auto& p = *peers_[id];
    if (!p.alive) return;
    p.alive = false;
    // Streams to it reset: every peer linked to it hears soon.
    for (auto [a, b] : links_) {
      if (a != id && b != id) continue;
      const int other = a == id ? b : a;
      push(now_ + 5ms, [this, other, id] {
        auto& o = *peers_[other];
        if (!o.alive || !o.mm) return;
        o.mm->on_peer_failed(pk_of(id), now_);
        pump(other);
      });
    }
  }
  void revive(int id) { peers_[id]->alive = true; }

 private:
  using Key = std::pair<WallTime, std::uint64_t>;
  void push(WallTime t, std::function<void()> fn) {
    events_.emplace(Key{t, seq_++}, std::move(fn));
  }
  // Random delay, but FIFO per direction of a pair (messages travel on streams).
  WallTime arrival(int from, int to) {
    auto& last = fifo_[{from, to}];
    const WallTime t = std::max(now_ + std::chrono::microseconds(500 + rng_() % 20000),
                                last + std::chrono::microseconds(1));
    last = t;
    return t;
  }
  PeerKey pk_of(int id) const { return pk(id); }
  int id_of(const PeerKey& k) const {
    return std::stoi(std::string(as_string(k.bytes()).substr(5)));
  }

  void start_peer(int id, Duration budget) {
    auto& p = *peers_[id];
    if (!p.alive) return;
    MemberInfo me;
    me.peer = pk(id);
    me.addrs = {"/ip4/10.0.0.1/tcp/" + std::to_string(1000 + id)};
    me.bandwidth = 1000 + rng_() % 1000;
    me.client = p.client;
    me.weight = 1.0;
    p.started = now_;
    p.mm =
        std::make_unique<MatchmakingCore>(cfg_, me, Bytes(32, static_cast<std::uint8_t>(p.schema)),
                                          p.key, now_, now_ + budget, rng_());
    pump(id);
  }

  // Reader `reader` sees an entry published at `at` after a per-(publisher, reader) delay.
  std::vector<MatchEntry> read(int reader, const std::string& key) {
    std::vector<MatchEntry> out;
    for (const auto& [peer, pubs] : dht_[key]) {
      const auto lag = std::chrono::milliseconds((id_of(peer) * 7919 + reader * 104729) % 400);
      // The newest version visible to this reader.
      const Published* best = nullptr;
      for (const auto& pb : pubs)
        if (pb.at + lag <= now_ && pb.e.deadline > now_) best = &pb;
      if (best) out.push_back(best->e);
    }
    return out;
  }

  void pump(int id) {
    auto& p = *peers_[id];
    if (!p.alive || !p.mm) return;
    auto& mm = *p.mm;
    if (mm.take_republish()) dht_[mm.key().to_string()][pk(id)].push_back({mm.entry(), now_});
    if (mm.wants_view(now_)) {
      mm.on_view(read(id, mm.key().to_string()), now_);
      if (mm.take_republish()) dht_[mm.key().to_string()][pk(id)].push_back({mm.entry(), now_});
    }
    for (auto& out : mm.take_outbox()) deliver(id, id_of(out.to), std::move(out.msg));
    if (mm.state() == MatchmakingCore::State::done ||
        mm.state() == MatchmakingCore::State::failed) {
      if (p.ended == WallTime{} || p.ended < p.started) p.ended = now_;
      return;
    }
    const WallTime w = mm.next_wakeup(now_);
    if (!p.wake || *p.wake <= now_ || *p.wake > w) {
      p.wake = w;
      push(w, [this, id, w] {
        auto& q = *peers_[id];
        if (q.wake == w) q.wake.reset();
        if (!q.alive || !q.mm) return;
        q.mm->tick(now_);
        pump(id);
      });
    }
  }

  void deliver(int from, int to, MatchMessage msg) {
    links_.insert({std::min(from, to), std::max(from, to)});
    push(arrival(from, to), [this, from, to, msg = std::move(msg)] {
      auto& dst = *peers_[to];
      auto& src = *peers_[from];
      if (!src.alive) return;  // the sender died with the message in its buffers
      if (!dst.alive) {
        // Connection refused / reset: the sender learns after a while.
        push(now_ + 50ms, [this, from, to] {
          auto& s = *peers_[from];
          if (!s.alive || !s.mm) return;
          s.mm->on_peer_failed(pk(to), now_);
          pump(from);
        });
        return;
      }
      if (auto* req = std::get_if<JoinRequest>(&msg)) {
        JoinReply reply{JoinVerdict::begun};
        if (dst.mm) reply = dst.mm->on_join(*req, now_);
        // The reply goes out on the join stream before anything the leader sends next.
        push(arrival(to, from), [this, from, to, reply] {
          auto& s = *peers_[from];
          if (!s.alive || !s.mm) return;
          if (!peers_[to]->alive) {
            s.mm->on_peer_failed(pk(to), now_);
          } else {
            s.mm->on_join_reply(pk(to), reply, now_);
          }
          pump(from);
        });
        pump(to);
        return;
      }
      if (!dst.mm) return;
      dst.mm->on_message(pk(from), msg, now_);
      pump(to);
    });
  }

  MatchmakingConfig cfg_;
  GroupKeyConfig kcfg_;
  std::mt19937_64 rng_;
  WallTime now_ = WallTime{} + 1000h;
  std::vector<std::unique_ptr<SimPeer>> peers_;
  std::map<Key, std::function<void()>> events_;
  std::uint64_t seq_ = 0;
  std::map<std::string, std::map<PeerKey, std::vector<Published>>> dht_;
  std::set<std::pair<int, int>> links_;
  std::map<std::pair<int, int>, WallTime> fifo_;
  std::vector<int> started_;
};

struct RoundStats {
  std::size_t grouped = 0, failed = 0, groups = 0, alive_started = 0;
};

// Checks the invariants of one round and returns its numbers.
RoundStats check_round(MatchSim& sim, const MatchmakingConfig& cfg, Duration budget) {
  RoundStats st;
  std::map<Bytes, GroupInfo> groups;
  std::map<PeerKey, Bytes> member_of;
  for (int id : sim.started()) {
    auto& p = sim.peer(id);
    if (!p.alive) continue;
    ++st.alive_started;
    if (!p.mm) {
      ADD_FAILURE() << "peer " << id << " never started";
      continue;
    }
    const auto s = p.mm->state();
    if (s == MatchmakingCore::State::failed) {
      ++st.failed;
      EXPECT_FALSE(p.mm->error().context().empty());
      EXPECT_TRUE(p.mm->error() == errc::timeout || p.mm->error() == errc::unavailable)
          << p.mm->error().message();
      // Ends by its deadline (plus the confirm grace for a follower whose leader vanished).
      EXPECT_LE(p.ended - p.started, budget + 2 * cfg.confirm_timeout + 1s)
          << p.mm->error().message();
      continue;
    }
    if (s != MatchmakingCore::State::done) {
      ADD_FAILURE() << "peer " << id << " has no outcome: state " << MatchmakingCore::state_name(s);
      continue;
    }
    ++st.grouped;
    EXPECT_LE(p.ended - p.started, budget + cfg.confirm_timeout + 1s);
    const auto& g = p.mm->group();
    auto [it, fresh] = groups.emplace(g.group_id, g);
    if (!fresh) {
      EXPECT_EQ(it->second.members.size(), g.members.size()) << "members disagree on the group";
      for (std::size_t i = 0; i < g.members.size() && i < it->second.members.size(); ++i)
        EXPECT_EQ(it->second.members[i].peer, g.members[i].peer);
    }
  }
  st.groups = groups.size();
  for (const auto& [gid, g] : groups) {
    EXPECT_GE(g.members.size(), cfg.min_group_size);
    EXPECT_LE(g.members.size(), cfg.target_group_size);
    EXPECT_TRUE(validate_members(g.members));
    bool any_leader = false;
    int schema = -1;
    for (const auto& m : g.members) {
      any_leader = any_leader || !m.client;
      auto [mit, fresh] = member_of.emplace(m.peer, gid);
      EXPECT_TRUE(fresh) << "a peer is in two groups";
      const int id = std::stoi(std::string(as_string(m.peer.bytes()).substr(5)));
      auto& p = sim.peer(id);
      if (schema < 0) schema = p.schema;
      EXPECT_EQ(p.schema, schema) << "mixed schemas in one group";
      // No ghosts: a live member listed in a group is done in that very group.
      if (p.alive && p.mm) {
        EXPECT_EQ(p.mm->state(), MatchmakingCore::State::done) << "ghost member " << id;
        if (p.mm->state() == MatchmakingCore::State::done) {
          EXPECT_EQ(p.mm->group().group_id, gid);
        }
      }
    }
    EXPECT_TRUE(any_leader);
  }
  return st;
}

// Moves every grouped peer to its next Moshpit key.
void advance_keys(MatchSim& sim) {
  for (std::size_t i = 0; i < sim.size(); ++i) {
    auto& p = sim.peer(static_cast<int>(i));
    if (!p.mm || p.mm->state() != MatchmakingCore::State::done) continue;
    const auto& g = p.mm->group();
    const auto rank = static_cast<std::uint32_t>(*g.index_of(pk(p.id)));
    p.key = p.key.next(rank, static_cast<std::uint32_t>(g.members.size()));
  }
}

}  // namespace

TEST(PlanGroups, SizesLeadersAndDeterminism) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = rng() % 60;
    const std::size_t target = 2 + rng() % 16, min = 1 + rng() % target;
    std::vector<MatchEntry> es;
    for (std::size_t i = 0; i < n; ++i) es.push_back(entry(static_cast<int>(i), rng() % 4 == 0));
    const auto g1 = plan_groups(es, "k", target, min);
    std::shuffle(es.begin(), es.end(), rng);
    const auto g2 = plan_groups(es, "k", target, min);
    EXPECT_EQ(g1, g2) << "plan depends on the order of the view";
    std::set<PeerKey> seen;
    std::size_t non_clients = 0;
    for (auto& e : es) non_clients += !e.info.client;
    for (const auto& g : g1) {
      EXPECT_GE(g.size(), min);
      EXPECT_LE(g.size(), target);
      const int leader = std::stoi(std::string(as_string(g[0].bytes()).substr(5)));
      EXPECT_FALSE(es.empty());
      for (auto& e : es) {
        if (e.info.peer == g[0]) {
          EXPECT_FALSE(e.info.client) << "client " << leader << " leads";
        }
      }
      for (auto& p : g) EXPECT_TRUE(seen.insert(p).second);
    }
    // Everyone is placed whenever capacity allows (enough leaders, at least min peers).
    if (n >= min && non_clients * target >= n &&
        n / std::max<std::size_t>(1, (n + target - 1) / target) >= min) {
      EXPECT_EQ(seen.size(), n) << "n " << n << " target " << target << " min " << min;
    }
  }
}

TEST(GroupKeyTest, NextKeySpreadsAGroup) {
  GroupKeyConfig cfg{"model", 8, 2};
  auto k = GroupKey::from_digits(cfg, {3, 5}).value();
  EXPECT_EQ(k.to_string(), "model/3.5");
  std::set<std::string> next;
  for (std::uint32_t r = 0; r < 8; ++r) next.insert(k.next(r, 8).to_string());
  EXPECT_EQ(next.size(), 8u);  // 8 members of one group go to 8 different keys
  EXPECT_EQ(k.next(7, 8).to_string(), "model/5.7");
  EXPECT_EQ(k.next(1, 2).to_string(), "model/5.4");  // rank 1 of 2 -> digit 4
  EXPECT_NE(k.dht_key(), k.next(0, 8).dht_key());
  EXPECT_FALSE(GroupKey::from_digits(cfg, {8, 0}));
  EXPECT_FALSE(GroupKey::initial({"a/b", 8, 1}, 1));
  auto plain = GroupKey::initial({"model", 16, 0}, 1).value();
  EXPECT_EQ(plain.to_string(), "model");
  EXPECT_EQ(plain.next(3, 5), plain);
}

TEST(Matchmaking, ManyPeersStartingAtOnceFormFullGroups) {
  MatchmakingConfig cfg;
  cfg.target_group_size = 8;
  cfg.min_group_size = 2;
  MatchSim sim(cfg, {"m", 8, 0}, 42);
  for (int i = 0; i < 100; ++i) sim.add_peer(i % 10 == 0, 0);
  for (int r = 0; r < 3; ++r) {
    sim.round(20s, 0ms);  // all at the same instant: the worst case for collisions
    auto st = check_round(sim, cfg, 20s);
    EXPECT_EQ(st.grouped, 100u) << "round " << r << ": " << st.failed << " failed";
    std::printf("round %d: %zu of 100 grouped in %zu groups\n", r, st.grouped, st.groups);
    EXPECT_LE(st.groups, 14u);  // 13 when every group is full (100 / 8)
  }
}

TEST(Matchmaking, MoshpitRoundsMixPeers) {
  MatchmakingConfig cfg;
  cfg.target_group_size = 4;
  cfg.min_group_size = 2;
  // 64 peers on a 4x4x4 grid: 16 keys of ~4 peers each.
  MatchSim sim(cfg, {"m", 4, 2}, 7);
  for (int i = 0; i < 64; ++i) sim.add_peer(false, 0);
  std::set<std::pair<int, int>> prev_pairs;
  std::size_t repeats = 0, pairs = 0, grouped = 0, started = 0;
  for (int r = 0; r < 6; ++r) {
    sim.round(10s, 300ms);
    auto st = check_round(sim, cfg, 10s);
    grouped += st.grouped;
    started += st.alive_started;
    std::set<std::pair<int, int>> cur;
    std::map<Bytes, std::vector<int>> by_group;
    for (int id = 0; id < 64; ++id) {
      auto& p = sim.peer(id);
      if (p.mm->state() == MatchmakingCore::State::done)
        by_group[p.mm->group().group_id].push_back(id);
    }
    for (auto& [gid, ids] : by_group)
      for (std::size_t a = 0; a < ids.size(); ++a)
        for (std::size_t b = a + 1; b < ids.size(); ++b) cur.insert({ids[a], ids[b]});
    for (auto& pr : cur) repeats += prev_pairs.count(pr);
    pairs += cur.size();
    prev_pairs = cur;
    advance_keys(sim);
  }
  // Members of a group move to different keys, so consecutive rounds share no pair.
  EXPECT_EQ(repeats, 0u);
  EXPECT_GT(pairs, 0u);
  std::printf("%zu of %zu grouped over 6 rounds, %zu pairs\n", grouped, started, pairs);
  EXPECT_GE(grouped * 100, started * 90) << grouped << " of " << started << " grouped";
}

TEST(Matchmaking, ChurnCrashesAndTwoSchemas) {
  MatchmakingConfig cfg;
  cfg.target_group_size = 16;
  cfg.min_group_size = 3;
  MatchSim sim(cfg, {"m", 16, 0}, 99);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200; ++i) sim.add_peer(rng() % 5 == 0, static_cast<int>(rng() % 2));
  std::size_t grouped = 0, started = 0;
  for (int r = 0; r < 6; ++r) {
    // Churn between rounds: ~10% leave, ~10% (re)join.
    for (int i = 0; i < 200; ++i) {
      if (rng() % 10 == 0)
        sim.kill(i);
      else if (rng() % 10 == 0)
        sim.revive(i);
    }
    sim.round(10s, 2s, 0.05);  // and ~5% crash during matchmaking
    auto st = check_round(sim, cfg, 10s);
    std::printf("round %d: %zu of %zu live peers grouped in %zu groups\n", r, st.grouped,
                st.alive_started, st.groups);
    grouped += st.grouped;
    started += st.alive_started;
  }
  EXPECT_GE(grouped * 100, started * 90) << grouped << " of " << started << " grouped";
}

TEST(Matchmaking, NoGroupEndsByTheDeadlineWithTheReason) {
  MatchmakingConfig cfg;
  cfg.min_group_size = 3;
  MatchSim sim(cfg, {"m", 16, 0}, 1);
  sim.add_peer(false, 0);
  sim.add_peer(false, 0);
  sim.add_peer(false, 1);  // a third peer, but with another schema
  sim.round(5s, 0ms);
  for (int id = 0; id < 3; ++id) {
    auto& p = sim.peer(id);
    ASSERT_EQ(p.mm->state(), MatchmakingCore::State::failed);
    EXPECT_EQ(p.mm->error(), errc::timeout);
    EXPECT_NE(p.mm->error().message().find("no group of at least 3"), std::string::npos)
        << p.mm->error().message();
    EXPECT_LE(p.ended - p.started, 5s + 100ms);
  }
}

TEST(Matchmaking, ClientsOnlyNeverGroup) {
  MatchmakingConfig cfg;
  MatchSim sim(cfg, {"m", 16, 0}, 2);
  for (int i = 0; i < 5; ++i) sim.add_peer(true, 0);
  sim.round(4s, 0ms);
  for (int id = 0; id < 5; ++id)
    EXPECT_EQ(sim.peer(id).mm->state(), MatchmakingCore::State::failed);
}

TEST(Matchmaking, SmallGroupBeginsWithoutWaitingForTheDeadline) {
  MatchmakingConfig cfg;
  cfg.target_group_size = 16;
  cfg.min_group_size = 2;
  cfg.min_wait = 2s;
  MatchSim sim(cfg, {"m", 16, 0}, 3);
  for (int i = 0; i < 5; ++i) sim.add_peer(false, 0);
  sim.round(30s, 200ms);
  auto st = check_round(sim, cfg, 30s);
  EXPECT_EQ(st.grouped, 5u);
  EXPECT_EQ(st.groups, 1u);
  for (int id = 0; id < 5; ++id)
    EXPECT_LT(sim.peer(id).ended - sim.peer(id).started, 5s) << "waited for the deadline";
}

TEST(Matchmaking, JoinRules) {
  MatchmakingConfig cfg;
  cfg.target_group_size = 3;
  auto key = GroupKey::initial({"m", 16, 0}, 1).value();
  MemberInfo me{pk(0), {}, 100, false, 1.0};
  const WallTime t0 = WallTime{} + 1h;
  MatchmakingCore l(cfg, me, Bytes(32, 1), key, t0, t0 + 10s, 1);
  auto req = [&](int i, Bytes schema = Bytes(32, 1), std::string k = "m") {
    return JoinRequest{MemberInfo{pk(i), {}, 100, false, 1.0}, schema, k, t0 + 10s};
  };
  EXPECT_EQ(l.on_join(req(1, Bytes(32, 2)), t0).verdict, JoinVerdict::schema_mismatch);
  EXPECT_EQ(l.on_join(req(1, Bytes(32, 1), "other"), t0).verdict, JoinVerdict::key_mismatch);
  EXPECT_EQ(l.on_join(req(1), t0).verdict, JoinVerdict::accepted);
  EXPECT_EQ(l.state(), MatchmakingCore::State::leading);
  EXPECT_EQ(l.on_join(req(2), t0).verdict, JoinVerdict::accepted);  // full now: begins
  EXPECT_EQ(l.state(), MatchmakingCore::State::beginning);
  EXPECT_EQ(l.on_join(req(3), t0).verdict, JoinVerdict::begun);
  auto out = l.take_outbox();
  ASSERT_EQ(out.size(), 2u);
  const auto gid = std::get<BeginMsg>(out[0].msg).group_id;
  l.on_message(pk(1), ConfirmMsg{gid}, t0);
  EXPECT_EQ(l.state(), MatchmakingCore::State::beginning);
  // Member 2 never confirms: after the confirm timeout the group starts without it.
  l.tick(t0 + cfg.confirm_timeout);
  ASSERT_EQ(l.state(), MatchmakingCore::State::done);
  EXPECT_EQ(l.group().members.size(), 2u);
  out = l.take_outbox();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].to, pk(1));
  // A follower is busy for others and ignores a Begin from anyone but its leader.
  MatchmakingCore f(cfg, MemberInfo{pk(5), {}, 100, false, 1.0}, Bytes(32, 1), key, t0, t0 + 10s,
                    2);
  std::vector<MatchEntry> view{entry(5), entry(6)};
  for (auto& e : view) e.deadline = t0 + 10s;
  f.on_view(view, t0);
  if (f.state() == MatchmakingCore::State::joining) {
    f.on_join_reply(*f.leader(), JoinReply{JoinVerdict::accepted}, t0);
    EXPECT_EQ(f.state(), MatchmakingCore::State::following);
    EXPECT_EQ(f.on_join(req(7), t0).verdict, JoinVerdict::busy);
    f.on_message(pk(9), BeginMsg{Bytes(16, 0)}, t0);
    EXPECT_EQ(f.state(), MatchmakingCore::State::following);
  } else {
    EXPECT_EQ(f.state(), MatchmakingCore::State::looking);  // planned leader of {5, 6}
  }
}

// cancel(): a leader releases its followers (Disband), a follower tells its leader (Leave), and
// both fail with errc::cancelled at once instead of waiting for their deadline.
TEST(Matchmaking, CancelDisbandsOrLeaves) {
  MatchmakingConfig cfg;
  cfg.target_group_size = 4;
  auto key = GroupKey::initial({"m", 16, 0}, 1).value();
  const WallTime t0 = WallTime{} + 1h;
  MatchmakingCore l(cfg, MemberInfo{pk(0), {}, 100, false, 1.0}, Bytes(32, 1), key, t0, t0 + 30s,
                    1);
  auto req = [&](int i) {
    return JoinRequest{MemberInfo{pk(i), {}, 100, false, 1.0}, Bytes(32, 1), "m", t0 + 30s};
  };
  ASSERT_EQ(l.on_join(req(1), t0).verdict, JoinVerdict::accepted);
  ASSERT_EQ(l.on_join(req(2), t0).verdict, JoinVerdict::accepted);
  ASSERT_EQ(l.state(), MatchmakingCore::State::leading);
  (void)l.take_outbox();
  l.cancel(t0 + 1s, "test");
  EXPECT_EQ(l.state(), MatchmakingCore::State::failed);
  EXPECT_EQ(l.error(), errc::cancelled);
  auto out = l.take_outbox();
  ASSERT_EQ(out.size(), 2u);
  std::set<PeerKey> told;
  for (const auto& o : out) {
    EXPECT_TRUE(std::holds_alternative<DisbandMsg>(o.msg));
    told.insert(o.to);
  }
  EXPECT_EQ(told, (std::set<PeerKey>{pk(1), pk(2)}));
  EXPECT_FALSE(l.entry().open);
  l.cancel(t0 + 2s, "again");  // no effect once failed
  EXPECT_TRUE(l.take_outbox().empty());

  // A follower: finds the leader in its view, joins, is accepted, cancels.
  for (int seed = 2; seed < 40; ++seed) {
    MatchmakingCore f(cfg, MemberInfo{pk(5), {}, 100, false, 1.0}, Bytes(32, 1), key, t0, t0 + 30s,
                      seed);
    std::vector<MatchEntry> view{entry(5), entry(6)};
    for (auto& e : view) e.deadline = t0 + 30s;
    f.on_view(view, t0 + cfg.settle);
    if (f.state() != MatchmakingCore::State::joining) continue;  // it plans to lead
    const PeerKey leader = *f.leader();
    f.on_join_reply(leader, JoinReply{JoinVerdict::accepted}, t0 + cfg.settle);
    ASSERT_EQ(f.state(), MatchmakingCore::State::following);
    (void)f.take_outbox();
    f.cancel(t0 + cfg.settle + 1s, "test");
    EXPECT_EQ(f.state(), MatchmakingCore::State::failed);
    EXPECT_EQ(f.error(), errc::cancelled);
    out = f.take_outbox();
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].to, leader);
    EXPECT_TRUE(std::holds_alternative<LeaveMsg>(out[0].msg));
    return;
  }
  FAIL() << "peer 5 never planned to follow";
}
