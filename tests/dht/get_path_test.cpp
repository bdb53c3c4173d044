// The get path's side effects and shortcuts: a reader's own copy never answers alone, cached
// copies along the path live briefly and never cost a new connection.
#include <gtest/gtest.h>

#include "sim_helpers.hpp"
#include "starling/crypto/keys.hpp"

using namespace starling;
using namespace starling::dht;
using namespace starling::dht::test;

namespace {
const NodeHeader kServer{false, {to_bytes("/ip4/127.0.0.1/tcp/1")}};

std::vector<std::size_t> holding(SimNetwork& net, const RecordKey& key) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < net.size(); ++i)
    if (!net.core(i).records().records(key.id(), net.time()).empty()) out.push_back(i);
  return out;
}
}  // namespace

TEST(DhtGetPath, AReadersStaleOwnCopyDoesNotAnswerAlone) {
  auto net = network(30);
  const auto key = RecordKey::from_string("rewritten");
  ASSERT_TRUE(store(net, 0, key, {plain("new", 2)}).status);
  const auto holders = holding(net, key);
  std::size_t reader = 1;
  while (std::find(holders.begin(), holders.end(), reader) != holders.end()) ++reader;
  // The reader holds an old version (a cache copy from before the rewrite, say).
  StoreRequest st;
  st.items.push_back(StoreItem{key, {plain("old", 1)}});
  const auto writer = net.core(holders.front()).peer();
  auto resp = net.core(reader).handle_request(writer, Request{kServer, st}, net.now_of(reader));
  ASSERT_EQ(std::get<StoreResponse>(resp.body).status.at(0), StoreStatus::accepted);
  const auto g = get(net, reader, key);
  EXPECT_EQ(value_of(g), "new");
  EXPECT_GE(g.stats.requests, 1u);
}

TEST(DhtGetPath, AnOwnCopyNobodyElseHoldsIsStillFound) {
  auto net = network(30);
  const auto key = RecordKey::from_string("only here");
  StoreRequest st;
  st.items.push_back(StoreItem{key, {plain("mine", 1)}});
  auto resp = net.core(5).handle_request(net.core(6).peer(), Request{kServer, st}, net.now_of(5));
  ASSERT_EQ(std::get<StoreResponse>(resp.body).status.at(0), StoreStatus::accepted);
  EXPECT_EQ(value_of(get(net, 5, key)), "mine");
}

TEST(DhtGetPath, CachedCopiesLiveAtMostTheCacheTtl) {
  SimOptions o = one_replica_options();
  o.config.cache_ttl = 20s;
  o.config.republish_interval = Duration::zero();
  auto net = network(80, o);
  const auto key = RecordKey::from_string("cache me briefly");
  ASSERT_TRUE(store(net, 0, key, {plain("v", 1, 10min)}, StoreOptions{1, false}).status);
  const auto replicas = holding(net, key);
  for (std::size_t i = 1; i < 40; ++i) ASSERT_EQ(value_of(get(net, i, key)), "v");
  std::size_t cached = 0;
  for (auto i : holding(net, key)) {
    if (std::find(replicas.begin(), replicas.end(), i) != replicas.end()) continue;
    ++cached;
    for (const auto& r : net.core(i).records().records(key.id(), net.time()))
      EXPECT_LE(r.ttl, 20s) << "node " << i;
  }
  EXPECT_GT(cached, 0u);
  net.run_for(21s);  // every cached copy is gone, the replica's stays
  EXPECT_EQ(holding(net, key), replicas);
}

TEST(DhtGetPath, NoCacheCopyOverANewConnection) {
  auto net = network(80, one_replica_options());
  // Every peer looks unconnected to the networked node's hint.
  for (std::size_t i = 0; i < net.size(); ++i)
    net.core(i).set_connected_hint([](const net::PeerId&) { return false; });
  const auto key = RecordKey::from_string("no dial for a cache");
  ASSERT_TRUE(store(net, 0, key, {plain("v", 1)}, StoreOptions{1, false}).status);
  const std::size_t before = holders(net, key);
  for (std::size_t i = 1; i < 40; ++i) ASSERT_EQ(value_of(get(net, i, key)), "v");
  net.run_for(5s);
  EXPECT_EQ(holders(net, key), before);
}

namespace {
// A core whose table holds `n` fresh peers (each sent it a ping) and which stores `key`.
std::unique_ptr<DhtCore> server_with(std::size_t n, const RecordKey& key, const Now& now) {
  auto peer = [] { return net::PeerId::from_public_key(crypto::KeyPair::generate().public_key()); };
  auto core =
      std::make_unique<DhtCore>(DhtConfig{}, peer(), ValidatorChain::standard(), 7, now.mono);
  for (std::size_t i = 0; i < n; ++i)
    core->handle_request(peer(), Request{kServer, PingRequest{}}, now);
  StoreRequest st;
  st.items.push_back(StoreItem{key, {plain("v", 1)}});
  auto resp = core->handle_request(peer(), Request{kServer, st}, now);
  EXPECT_EQ(std::get<StoreResponse>(resp.body).status.at(0), StoreStatus::accepted);
  return core;
}
FindResult only_result(const Response& r) {
  return std::get<FindResponse>(r.body).results.at(0);
}
}  // namespace

// A get that is not `latest` ends at its first plain value, so a holder answers it with the
// value alone; peers still go out with a dictionary (the getter wants a quorum of answers),
// without records (a key it lacks) and to every other kind of lookup.
TEST(DhtGetPath, AHolderAnswersAPlainGetWithTheValueAlone) {
  const Now now{TimePoint{} + 1h, WallTime{}};
  const auto key = RecordKey::from_string("held"), other = RecordKey::from_string("not held");
  auto core = server_with(30, key, now);
  const auto asker = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
  FindRequest f{{key.id()}, true, true};
  const auto alone = only_result(core->handle_request(asker, Request{kServer, f}, now));
  EXPECT_EQ(alone.records.size(), 1u);
  EXPECT_TRUE(alone.peers.empty());
  f.value_suffices = false;  // a latest get, a dictionary quorum, an older requester
  const auto both = only_result(core->handle_request(asker, Request{kServer, f}, now));
  EXPECT_EQ(both.records.size(), 1u);
  EXPECT_EQ(both.peers.size(), DhtConfig{}.k);
  const auto dict = RecordKey::from_string("dictionary");
  StoreRequest st;
  st.items.push_back(StoreItem{dict, {entry("a", "x", 1)}});
  core->handle_request(asker, Request{kServer, st}, now);
  FindRequest d{{dict.id()}, true, true};
  const auto with_peers = only_result(core->handle_request(asker, Request{kServer, d}, now));
  EXPECT_EQ(with_peers.records.size(), 1u);
  EXPECT_EQ(with_peers.peers.size(), DhtConfig{}.k);
  FindRequest miss{{other.id()}, true, true};
  const auto peers = only_result(core->handle_request(asker, Request{kServer, miss}, now));
  EXPECT_TRUE(peers.records.empty());
  EXPECT_EQ(peers.peers.size(), DhtConfig{}.k);
}

TEST(DhtGetPath, OnlyAPlainGetSaysTheValueSuffices) {
  const Now now{TimePoint{} + 1h, WallTime{}};
  const auto key = RecordKey::from_string("asked");
  auto core = server_with(10, key, now);
  auto first_find = [&](GetOptions o) {
    core->get(key, o, now);
    std::optional<FindRequest> out;
    while (auto r = core->poll_request())
      if (auto* f = std::get_if<FindRequest>(&r->request.body); f && !out) out = *f;
    return out;
  };
  GetOptions plain_get, latest;
  latest.latest = true;
  auto a = first_find(plain_get), b = first_find(latest);
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(a->want_values && a->value_suffices);
  EXPECT_TRUE(b->want_values && !b->value_suffices);
}
