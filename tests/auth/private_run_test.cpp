// Private runs over the network (NetCollaboration with a MembershipConfig, nodes on loopback):
// three members train together while an outsider using the run's name is refused by
// matchmaking, gets no state and has its progress records ignored; a member whose certificate
// is revoked mid-run is dropped within a bounded time. The control test runs the same outsider
// against an open run, where it is counted and averaged with (so the checks here can fail).
#include <gtest/gtest.h>

#include <iostream>
#include <set>
#include <thread>

#include "starling/training/progress.hpp"
#include "starling/training/state_format.hpp"
#include "support/average_all.hpp"
#include "support/crashable_node.hpp"

using namespace starling;
using namespace starling::auth;
namespace sf = starling::training::state_format;

namespace {

using Collab = std::shared_ptr<collab::NetCollaboration>;
using Node = std::unique_ptr<test::CrashableNode>;
constexpr std::size_t kW = 1000;
constexpr Duration kRound = 20s;

struct Authority {
  crypto::KeyPair key = crypto::KeyPair::generate();
  Key32 run = key32(key.public_key()).value();

  MembershipConfig config_for(const crypto::KeyPair& member) const {
    MembershipConfig m;
    m.run_key = run;
    const auto now = unix_seconds(WallClock::now());
    m.certificate =
        encode(sign_certificate(key, key32(member.public_key()).value(), now, now + 3600).value());
    m.poll_interval = 1s;
    m.lookup_interval = 200ms;
    m.lookup_timeout = 3s;
    return m;
  }
};

collab::NetCollaborationConfig base_config() {
  collab::NetCollaborationConfig c;
  c.run_id = "private";
  c.stall_timeout = 6s;
  c.open_timeout = 20s;
  return c;
}

Node start_node(const std::vector<net::Multiaddr>& seed, const Authority* auth) {
  auto key = crypto::KeyPair::generate();
  auto cfg = base_config();
  if (auth) cfg.membership = auth->config_for(key);
  return test::CrashableNode::start(seed, cfg, key);
}

// n nodes (members of `auth`'s run, or of an open run if null), bootstrapped through the first.
struct Nodes {
  std::vector<Node> nodes;
  std::vector<Collab> cs;
  Nodes(std::size_t n, const Authority* auth) {
    nodes.push_back(start_node({}, auth));
    for (std::size_t i = 1; i < n; ++i)
      nodes.push_back(start_node(nodes[0]->listen_addresses(), auth));
    for (auto& x : nodes) cs.push_back(x->collaboration());
  }
};

template <class F>
auto on(const Collab& c, F f) {
  return block_on(c->executor(), std::move(f), 60s);
}

// Publishes a progress record and returns the peers whose records `c` accepts.
std::set<net::PeerId> progress_peers(const Collab& c) {
  auto r = on(c, [c]() { return c->fetch_progress(); });
  std::set<net::PeerId> out;
  if (r)
    for (const auto& e : r.value()) out.insert(e.peer);
  return out;
}

void publish(const Collab& c) {
  auto r = on(c, [c]() { return c->publish_progress(to_bytes("progress"), 30s); });
  ASSERT_TRUE(r) << r.error().message();
}

// Polls `c`'s progress view until it is exactly `want` or `limit` passes; returns the time it
// took (or limit).
Duration until_view(const Collab& c, const std::set<net::PeerId>& want, Duration limit) {
  const TimePoint t0 = Clock::now();
  while (Clock::now() - t0 < limit) {
    if (progress_peers(c) == want) return Clock::now() - t0;
    std::this_thread::sleep_for(50ms);  // a poll of the DHT view, not a wait for an event
  }
  return limit;
}

std::vector<test::RoundOutcome> average_all(const std::vector<Collab>& cs, const std::string& key,
                                            const std::vector<float>& values,
                                            const std::vector<std::size_t>& expected) {
  test::RoundSpec spec;
  spec.key = key;
  spec.floats = kW;
  spec.timeout = kRound;
  spec.values = values;
  spec.expected = expected;
  return test::average_all(cs, spec);
}

// A small training state and its digest (what a donor serves).
struct FixedState {
  std::shared_ptr<const Bytes> bytes;
  std::uint64_t digest;
  awaitable<result<training::Collaboration::State>> operator()() const {
    training::Collaboration::State s;
    s.epoch = 3;
    s.bytes = *bytes;
    s.digest = digest;
    co_return s;
  }
};

FixedState make_state() {
  static const std::vector<float> w(500, 0.25f);
  sf::TrainingState s;
  s.model = {{"w",
              {sf::Dtype::f32,
               {static_cast<std::int64_t>(w.size())},
               BytesView(reinterpret_cast<const std::uint8_t*>(w.data()), w.size() * 4)}}};
  training::StateDigest d;
  d.update(w.data(), w.size() * sizeof(float));
  return {std::make_shared<const Bytes>(sf::encode(s).value()), d.value()};
}

void serve(const Collab& c, FixedState f) {
  auto r = on(c, [c, f]() -> awaitable<result<void>> {
    c->serve_state(f);
    co_return success();
  });
  ASSERT_TRUE(r);
}

// serve() announces in the background: until a donor's announcement is in the DHT a download
// finds nobody (errc::not_found), so a member retries that within the deadline.
result<training::Collaboration::State> download(const Collab& c) {
  const auto deadline = Clock::now() + 15s;
  for (;;) {
    auto r = on(c, [c, deadline]() { return c->download_state(deadline, 0); });
    if (r || r.error().code() != errc::not_found || Clock::now() >= deadline) return r;
    std::this_thread::sleep_for(50ms);
  }
}

// How many of `peers` `gate` admits; then stops it.
awaitable<result<std::size_t>> count_admitted(std::shared_ptr<MembershipService> gate,
                                              std::vector<net::PeerId> peers) {
  std::size_t admitted = 0;
  for (const auto& p : peers) {
    const bool yes = co_await gate->admit(p);
    admitted += yes ? 1 : 0;
  }
  co_await gate->stop();
  co_return admitted;
}

std::set<net::PeerId> ids(const std::vector<Collab>& cs) {
  std::set<net::PeerId> out;
  for (const auto& c : cs) out.insert(c->self());
  return out;
}

}  // namespace

TEST(PrivateRun, OutsiderIsRefusedEverywhere) {
  Authority auth;
  Nodes run(3, &auth);
  Node outsider = start_node(run.nodes[0]->listen_addresses(), nullptr);  // no certificate
  const auto& members = run.cs;
  const Collab out = outsider->collaboration();
  for (const auto& c : members) publish(c);
  publish(out);

  // Progress: once the outsider's record is in the DHT (the outsider reads all four), every
  // member sees the three members and never the outsider (three reads each).
  const auto member_ids = ids(members);
  auto all = member_ids;
  all.insert(out->self());
  ASSERT_LT(until_view(out, all, 20s), 20s);
  for (const auto& c : members) {
    EXPECT_LT(until_view(c, member_ids, 20s), 20s);
    for (int read = 0; read < 3; ++read) EXPECT_EQ(progress_peers(c).count(out->self()), 0u);
  }

  // State: members serve; a member downloads, the outsider gets nothing.
  const auto st = make_state();
  serve(members[0], st);
  serve(members[1], st);
  auto mine = download(members[2]);
  ASSERT_TRUE(mine) << mine.error().message();
  EXPECT_EQ(mine.value().bytes, *st.bytes);
  auto theirs = download(out);
  EXPECT_FALSE(theirs) << "the outsider downloaded the state";

  // Averaging: the members average among themselves; the outsider's value never counts.
  std::vector<Collab> everyone = members;
  everyone.push_back(out);
  auto r = average_all(everyone, "grads/0", {1, 2, 3, 1000}, {3, 3, 3, 3});
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(r[i].r) << "member " << i << ": " << r[i].r.error().message();
    EXPECT_EQ(r[i].r.value().members.size(), 3u) << "member " << i;
    for (const auto& m : r[i].r.value().members) EXPECT_NE(m.peer, out->self());
    EXPECT_NEAR(r[i].w[0], 2.0f, 1e-5f) << "member " << i;
  }
  EXPECT_FALSE(r[3].r) << "the outsider averaged with " << r[3].r.value().members.size();

  // An observer (no certificate, e.g. a monitor) on the outsider's node learns the members
  // from the DHT and admits exactly them.
  MembershipConfig oc;
  oc.run_key = auth.run;
  auto observer = MembershipService::create(outsider->dht(), oc);
  ASSERT_TRUE(observer) << observer.error().message();
  auto obs = observer.value();
  std::vector<net::PeerId> asked(member_ids.begin(), member_ids.end());
  asked.push_back(out->self());
  auto seen = on(out, [obs, asked]() { return count_admitted(obs, asked); });
  ASSERT_TRUE(seen);
  EXPECT_EQ(seen.value(), 3u) << "the observer admits the three members and not the outsider";

  auto stats = members[0]->membership()->stats();
  EXPECT_GT(stats.refused, 0u);
  std::cout << "membership of member 0: " << stats.refreshes << " reads of the members ("
            << stats.lookups << " lookups), " << stats.refused << " refusals, "
            << members[0]->membership()->membership()->stats().verified
            << " certificate signatures checked\n";
}

TEST(PrivateRun, RevokedMemberIsDroppedWithinBoundedTime) {
  Authority auth;
  Nodes run(3, &auth);
  const auto& cs = run.cs;
  for (const auto& c : cs) publish(c);
  for (const auto& c : cs) ASSERT_LT(until_view(c, ids(cs), 20s), 20s);
  auto before = average_all(cs, "grads/0", {1, 2, 3}, {3, 3, 3});
  for (const auto& o : before) ASSERT_TRUE(o.r) << o.r.error().message();

  // The organiser revokes member 2; member 0 publishes the list. Members 0 and 1 must refuse
  // member 2 within poll_interval (1 s) plus a DHT read; 10 s allows for a loaded machine.
  const auto revoked = cs[2]->self();
  const auto now = unix_seconds(WallClock::now());
  const auto list = sign_revocations(auth.key, 1, now, {{member_key(revoked).value(), now}});
  ASSERT_TRUE(list);
  auto c0 = cs[0];
  const TimePoint published = Clock::now();
  auto p =
      on(c0, [c0, b = encode(list.value())]() { return c0->membership()->publish_revocations(b); });
  ASSERT_TRUE(p) << p.error().message();
  // Both remaining members hold the list (member 0 at once, member 1 from the DHT), then
  // neither counts the revoked member's progress record (its 30 s ttl has not run out).
  for (int i = 0; i < 2; ++i) {
    const auto& m = *cs[i]->membership()->membership();
    while (m.status(revoked, unix_seconds(WallClock::now())) != MemberStatus::revoked &&
           Clock::now() - published < 10s)
      std::this_thread::sleep_for(10ms);  // a poll of the member's state, not a wait for time
  }
  const Duration took = Clock::now() - published;
  EXPECT_LT(took, 10s) << "a member did not learn the revocation";
  const std::set<net::PeerId> remaining{cs[0]->self(), cs[1]->self()};
  for (int i = 0; i < 2; ++i)
    for (int read = 0; read < 3; ++read)
      EXPECT_EQ(progress_peers(cs[i]), remaining) << "member " << i << ", read " << read;
  std::cout << "revoked member refused by both members "
            << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
            << " ms after the list was published (poll interval 1 s)\n";

  // The next round: members 0 and 1 average without it; it cannot join them.
  auto after = average_all(cs, "grads/1", {1, 2, 30}, {2, 2, 3});
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(after[i].r) << "member " << i << ": " << after[i].r.error().message();
    EXPECT_EQ(after[i].r.value().members.size(), 2u);
    EXPECT_NEAR(after[i].w[0], 1.5f, 1e-5f);
  }
  EXPECT_FALSE(after[2].r) << "the revoked member averaged";
}

// The control: the same outsider in an open run is counted and averaged with.
TEST(PrivateRun, OpenRunCountsTheOutsider) {
  Nodes run(4, nullptr);
  const auto& cs = run.cs;
  for (const auto& c : cs) publish(c);
  EXPECT_LT(until_view(cs[0], ids(cs), 20s), 20s);
  auto r = average_all(cs, "grads/0", {1, 2, 3, 1000}, {4, 4, 4, 4});
  for (const auto& o : r) {
    ASSERT_TRUE(o.r) << o.r.error().message();
    EXPECT_EQ(o.r.value().members.size(), 4u);
    EXPECT_NEAR(o.w[0], 251.5f, 1e-3f);
  }
}
