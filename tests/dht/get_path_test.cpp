// The get path's side effects and shortcuts: a reader's own copy never answers alone, cached
// copies along the path live briefly and never cost a new connection.
#include <gtest/gtest.h>

#include "sim_helpers.hpp"

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
