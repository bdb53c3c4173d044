// Early matchmaking: NetCollaboration::prepare_round begins the round's matchmaking
// (Averager::begin) before the data exists, and average() with the prepared key completes it
// with its tensors; a stale prepared round is cancelled and the next round still works; stop()
// with a prepared round is bounded. Then the optimizer's side over the Hub double: what it
// prepares, and nothing prepared survives shutdown.
#include <gtest/gtest.h>

#include <thread>

#include "optim/hub_peer.hpp"
#include "support/crashable_node.hpp"
#include "support/round_data.hpp"

using namespace starling;
using namespace starling::optim;
using namespace starling::training;

namespace {

using Collab = std::shared_ptr<collab::NetCollaboration>;
using Layout = std::vector<std::pair<std::string, std::size_t>>;

constexpr std::size_t kW = 1000, kB = 10;

Layout layout() {
  return {{"w", kW}, {"b", kB}};
}

// Three nodes on loopback whose rounds need all three (minimum group 3), so the only group a
// round can form is all of them.
struct Trio {
  std::vector<std::unique_ptr<test::CrashableNode>> nodes;
  Trio() {
    auto cfg = test::loopback_config(test::loopback_options("early", 8));
    cfg.matchmaking.min_group_size = 3;
    nodes.push_back(test::CrashableNode::start({}, cfg));
    const auto seed = nodes[0]->listen_addresses();
    for (int i = 1; i < 3; ++i) nodes.push_back(test::CrashableNode::start(seed, cfg));
  }
  Collab c(std::size_t i) const { return nodes[i]->collaboration(); }
};

RoundPlan plan(const std::string& key, Duration lead, Duration round = 60s) {
  RoundPlan p;
  p.expected_start = Clock::now() + lead;
  p.options.key = key;
  p.options.weight = 1;
  p.options.deadline = p.expected_start + round;
  p.options.expected_members = 3;
  p.layout = layout();
  return p;
}

// Runs f(collaboration) on the node's io thread (bounded) and returns what it returns.
template <class T, class F>
T on_io(const Collab& c, F f) {
  auto r = block_on(
      c->executor(), [c, f]() -> awaitable<result<T>> { co_return f(*c); }, 30s);
  if (!r) throw std::runtime_error("io thread: " + r.error().message());
  return std::move(r).value();
}

void prepare(const Collab& c, const RoundPlan& p) {
  on_io<bool>(c, [p](collab::NetCollaboration& n) {
    n.prepare_round(p);
    return true;
  });
}
void cancel(const Collab& c) {
  on_io<bool>(c, [](collab::NetCollaboration& n) {
    n.cancel_prepared_round();
    return true;
  });
}
bool grouped(const Collab& c) {
  return on_io<bool>(c, [](collab::NetCollaboration& n) { return n.prepared_round_grouped(); });
}
std::string prepared_key(const Collab& c) {
  return on_io<std::string>(c, [](collab::NetCollaboration& n) { return n.prepared_round(); });
}
collab::EarlyStats stats(const Collab& c) {
  return on_io<collab::EarlyStats>(c, [](collab::NetCollaboration& n) { return n.early_stats(); });
}

struct Outcome {
  result<RoundResult> r = make_error(errc::internal, "not run");
  std::vector<float> w, b;
};

// One round on node c with every value = `value` and weight = `weight`.
awaitable<result<RoundResult>> average_on(Collab c, std::shared_ptr<Outcome> out, RoundOptions o) {
  auto d = test::round_data({{"w", out->w}, {"b", out->b}});
  auto r = co_await c->average(d, o);
  if (r) test::split(d, {out->w, out->b});
  co_return r;
}

// Node i averages `key` on a thread of its own (values i + 1, weight 10 (i + 1)).
std::shared_ptr<Outcome> start_average(const Trio& t, std::size_t i, const std::string& key,
                                       std::vector<std::thread>& threads) {
  auto out = std::make_shared<Outcome>();
  out->w.assign(kW, static_cast<float>(i + 1));
  out->b.assign(kB, static_cast<float>(i + 1));
  RoundOptions o;
  o.key = key;
  o.weight = 10.0 * static_cast<double>(i + 1);
  o.deadline = Clock::now() + 60s;
  o.expected_members = 3;
  threads.emplace_back([c = t.c(i), out, o] {
    auto r = block_on(
        c->executor(), [c, out, o] { return average_on(c, out, o); }, 90s);
    out->r = std::move(r);
  });
  return out;
}

std::vector<Outcome> join_all(std::vector<std::thread>& threads,
                              const std::vector<std::shared_ptr<Outcome>>& outs) {
  for (auto& th : threads) th.join();
  std::vector<Outcome> v;
  for (auto& o : outs) v.push_back(std::move(*o));
  return v;
}

// Every node of the trio averages `key` at once.
std::vector<Outcome> average_all(const Trio& t, const std::string& key) {
  std::vector<std::shared_ptr<Outcome>> outs;
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < 3; ++i) outs.push_back(start_average(t, i, key, threads));
  return join_all(threads, outs);
}

// The weighted mean of the trio's values: (10 x 1 + 20 x 2 + 30 x 3) / 60.
void expect_mean(const std::vector<Outcome>& outs, bool early) {
  for (std::size_t i = 0; i < outs.size(); ++i) {
    ASSERT_TRUE(outs[i].r) << "node " << i << ": " << outs[i].r.error().message();
    EXPECT_EQ(outs[i].r.value().members.size(), 3u) << "node " << i;
    EXPECT_EQ(outs[i].r.value().early, early) << "node " << i;
    EXPECT_DOUBLE_EQ(outs[i].r.value().total_weight, 60.0);
    for (float x : outs[i].w) ASSERT_NEAR(x, 140.0 / 60.0, 1e-5);
    for (float x : outs[i].b) ASSERT_NEAR(x, 140.0 / 60.0, 1e-5);
    // Bit-identical on every member.
    EXPECT_EQ(outs[i].w, outs[0].w);
  }
}

// Every node prepares `key`; true once all three are in its group.
bool prepare_all_until_grouped(const Trio& t, const std::string& key) {
  for (std::size_t i = 0; i < 3; ++i) prepare(t.c(i), plan(key, 1s));
  return test::wait_until([&] { return grouped(t.c(0)) && grouped(t.c(1)) && grouped(t.c(2)); },
                          60s);
}

// Every node's counters, and nothing prepared any more.
void expect_stats(const Trio& t, std::uint64_t prepared, std::uint64_t used,
                  std::uint64_t cancelled) {
  for (std::size_t i = 0; i < 3; ++i) {
    const auto s = stats(t.c(i));
    EXPECT_EQ(s.prepared, prepared) << "node " << i;
    EXPECT_EQ(s.used, used) << "node " << i;
    EXPECT_EQ(s.cancelled, cancelled) << "node " << i;
    EXPECT_EQ(prepared_key(t.c(i)), "") << "node " << i;
  }
}

}  // namespace

TEST(EarlyMatchmaking, PreparedRoundGroupsBeforeTheDataAndTheRoundUsesIt) {
  Trio t;
  // The group forms with no data anywhere (it can only be all three).
  ASSERT_TRUE(prepare_all_until_grouped(t, "grads/0"))
      << "the prepared round never formed its group";
  // Preparing the same key again changes nothing.
  prepare(t.c(1), plan("grads/0", 1s));
  EXPECT_EQ(prepared_key(t.c(1)), "grads/0");
  expect_mean(average_all(t, "grads/0"), true);
  expect_stats(t, 1, 1, 0);
  // The next round (not prepared) is an ordinary one.
  expect_mean(average_all(t, "grads/1"), false);
}

TEST(EarlyMatchmaking, AMembersDataTellsTheOthersTheirPreparedRoundIsWaiting) {
  Trio t;
  ASSERT_TRUE(prepare_all_until_grouped(t, "grads/0"));
  for (std::size_t i = 0; i < 3; ++i) EXPECT_FALSE(t.c(i)->peers_supplied("grads/0"));
  // Node 0's data goes out; nodes 1 and 2 (still "computing") learn it from its parts.
  std::vector<std::shared_ptr<Outcome>> outs;
  std::vector<std::thread> threads;
  outs.push_back(start_average(t, 0, "grads/0", threads));
  const bool told = test::wait_until(
      [&] { return t.c(1)->peers_supplied("grads/0") && t.c(2)->peers_supplied("grads/0"); }, 60s);
  EXPECT_TRUE(told) << "the members still computing were not told";
  EXPECT_FALSE(t.c(0)->peers_supplied("grads/0")) << "node 0 supplied its own data first";
  EXPECT_FALSE(t.c(1)->peers_supplied("grads/1"));
  for (std::size_t i = 1; i < 3; ++i) outs.push_back(start_average(t, i, "grads/0", threads));
  expect_mean(join_all(threads, outs), true);
}

TEST(EarlyMatchmaking, StalePreparedRoundIsCancelledAndTheNextRoundWorks) {
  Trio t;
  // Grouped, then stale: node 0 is told (its epoch moved on), the others find out when their
  // next round has another key.
  ASSERT_TRUE(prepare_all_until_grouped(t, "grads/0"));
  cancel(t.c(0));
  EXPECT_EQ(prepared_key(t.c(0)), "");
  expect_mean(average_all(t, "grads/1"), false);
  expect_stats(t, 1, 0, 1);
  // Stale while still matchmaking (nobody else prepared it): the next round waits for it to
  // end (its matchmaking deadline, ~2 s) and then runs.
  prepare(t.c(0), plan("grads/7", 0s, 4s));
  EXPECT_EQ(prepared_key(t.c(0)), "grads/7");
  EXPECT_FALSE(grouped(t.c(0)));
  expect_mean(average_all(t, "grads/2"), false);
  EXPECT_EQ(stats(t.c(0)).cancelled, 2u);
}

TEST(EarlyMatchmaking, StopWithAPreparedRoundIsBounded) {
  Trio t;
  // Alone in its round (minimum 3) with a matchmaking deadline a minute away.
  prepare(t.c(0), plan("grads/0", 1s, 120s));
  ASSERT_EQ(prepared_key(t.c(0)), "grads/0");
  auto c = t.c(0);
  auto r = block_on(
      c->executor(),
      [c]() -> awaitable<result<void>> {
        co_await c->stop();
        co_return success();
      },
      30s);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(prepared_key(c), "");
  EXPECT_EQ(stats(c).cancelled, 1u);
  // A stopped collaboration prepares nothing.
  prepare(c, plan("grads/1", 1s));
  EXPECT_EQ(prepared_key(c), "");
  EXPECT_EQ(stats(c).prepared, 1u);
}

// The optimizer prepares each epoch's round (key, layout, expected members) over the Hub,
// rounds complete prepared rounds, and after shutdown nothing prepared is left.
TEST(EarlyMatchmaking, OptimizerPreparesEachRoundAndShutdownLeavesNonePending) {
  auto hub = std::make_shared<test::Hub>(500ms);
  auto o = test::hub_options("early", 2000, 8);
  o.matchmaking_time = 10s;  // prepare as soon as the other peer is seen at the epoch
  std::mutex mu;
  std::map<std::uint64_t, std::vector<torch::Tensor>> record;
  std::vector<std::unique_ptr<test::HubPeer>> peers;
  for (int i = 0; i < 2; ++i) peers.push_back(std::make_unique<test::HubPeer>(hub, 1, o));
  for (int i = 0; i < 2; ++i) peers[i]->start(100 + i, mu, record, 6);
  ASSERT_TRUE(test::wait_until([&] { return test::min_live_epoch(peers) >= 6; }, 120s));
  std::uint64_t used = 0;
  for (auto& p : peers) {
    p->stop = true;
    if (p->thread.joinable()) p->thread.join();
    ASSERT_TRUE(p->opt->shutdown(10s));
    const auto s = p->collab->early_stats();
    EXPECT_GE(s.prepared, 1u);
    EXPECT_EQ(s.prepared, s.used + s.cancelled) << "a prepared round outlived shutdown";
    used += s.used;
    std::set<std::string> keys;
    for (const auto& plan : p->collab->plans()) {
      EXPECT_TRUE(keys.insert(plan.options.key).second) << "prepared twice: " << plan.options.key;
      EXPECT_EQ(plan.options.key.rfind("grads/", 0), 0u) << plan.options.key;
      ASSERT_EQ(plan.layout.size(), 2u);  // Linear(4, 1): weight, bias
      EXPECT_EQ(plan.layout[0].second, 4u);
      EXPECT_EQ(plan.layout[1].second, 1u);
      EXPECT_GE(plan.options.expected_members, 2u);
      // Prepared only with the other peer at the epoch, and nobody else is behind: every
      // round expects both, so its leader begins as soon as both are in.
      EXPECT_EQ(plan.options.expected_group, 2u) << plan.options.key;
      EXPECT_GE(plan.options.deadline, plan.expected_start);
    }
  }
  EXPECT_GE(used, 1u) << "no round completed a prepared one";
  std::lock_guard lk(mu);
  test::expect_agreement(record, 3);
}

// abandon_round() ends an average() still matchmaking at once with errc::unavailable (the
// optimizer calls it when a fresh fetch shows peers past its epoch and too few left at it),
// not at its matchmaking deadline (here 30 s: half of the 60 s round). The round can never
// form: only node 0 averages and the group needs all three.
TEST(EarlyMatchmaking, AbandonedRoundEndsAtOnce) {
  Trio t;
  auto out = std::make_shared<Outcome>();
  out->w.assign(kW, 1.0f);
  out->b.assign(kB, 1.0f);
  RoundOptions o;
  o.key = "grads/7";
  o.weight = 1;
  o.deadline = Clock::now() + 60s;
  o.expected_members = 3;
  std::atomic<bool> done{false};
  const auto t0 = Clock::now();
  std::thread th([c = t.c(0), out, o, &done] {
    out->r = block_on(
        c->executor(), [c, out, o] { return average_on(c, out, o); }, 90s);
    done = true;
  });
  // Abandon until it took effect (the first calls may come before the round is running).
  const bool ended = test::wait_until(
      [&] {
        on_io<bool>(t.c(0), [](collab::NetCollaboration& n) {
          n.abandon_round("grads/7");
          return true;
        });
        return done.load();
      },
      20s);
  th.join();
  EXPECT_TRUE(ended) << "the abandoned round went on";
  EXPECT_LT(Clock::now() - t0, 20s);
  ASSERT_FALSE(out->r);
  EXPECT_EQ(out->r.error(), errc::unavailable) << out->r.error().message();
  EXPECT_EQ(out->w, std::vector<float>(kW, 1.0f));  // unchanged
  // Another key is not affected by abandoning this one: the next round of all three works.
  expect_mean(average_all(t, "grads/8"), false);
}
