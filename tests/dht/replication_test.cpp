// Replication on join (DhtConfig::replicate_on_join, src/dht/core_replicate.cpp) on small
// simulated networks: a node that joins closer to a key than the existing replicas receives
// the key's records without a new store (so a get that reaches it first sees the whole
// dictionary), also after a restart with the same identity; replicated records pass the
// receiver's validators like any store; a newcomer gets a bounded number of records, once per
// cooldown.
#include <gtest/gtest.h>

#include "sim_helpers.hpp"
#include "starling/dht/signing.hpp"

using namespace starling;
using namespace starling::dht;
using namespace starling::dht::test;

namespace {

// A key whose id is closer to node `n` than to any other node of the network.
RecordKey key_closest_to(SimNetwork& net, std::size_t n, const std::string& prefix) {
  for (int j = 0;; ++j) {
    auto key = RecordKey::from_string(prefix + std::to_string(j));
    bool best = true;
    for (std::size_t i = 0; i < net.size() && best; ++i)
      if (i != n && closer(key.id(), net.core(i).id(), net.core(n).id())) best = false;
    if (best) return key;
  }
}

// A key for which node `n` is not among the `count` closest nodes.
RecordKey key_far_from(SimNetwork& net, std::size_t n, std::size_t count,
                       const std::string& prefix) {
  for (int j = 0;; ++j) {
    auto key = RecordKey::from_string(prefix + std::to_string(j));
    std::size_t closer_nodes = 0;
    for (std::size_t i = 0; i < net.size(); ++i)
      if (i != n && closer(key.id(), net.core(i).id(), net.core(n).id())) ++closer_nodes;
    if (closer_nodes >= 2 * count) return key;
  }
}

std::vector<Record> held(SimNetwork& net, std::size_t i, const RecordKey& key) {
  return net.core(i).records().records(key.id(), net.time());
}

std::uint64_t replicated(SimNetwork& net) {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < net.size(); ++i) n += net.core(i).replicated_records();
  return n;
}

SimOptions options(bool replicate) {
  SimOptions o;
  o.config = small_config();  // k = 8, 4 replicas
  o.config.replicate_on_join = replicate;
  return o;
}

}  // namespace

TEST(DhtReplication, NewcomerCloserToAKeyReceivesItsRecordsWithoutANewStore) {
  auto o = options(true);
  SimNetwork net(o);
  net.grow(30);
  const std::size_t newcomer = net.add_node();  // not joined yet
  net.run_for(30s);
  const auto key = key_closest_to(net, newcomer, "near-");
  const auto far = key_far_from(net, newcomer, o.config.replicas, "far-");
  ASSERT_TRUE(store(net, 1, key, {plain("v", 1)}).status);
  ASSERT_TRUE(store(net, 2, far, {plain("w", 1)}).status);
  net.run_for(5s);
  ASSERT_TRUE(held(net, newcomer, key).empty());
  const std::uint64_t before = replicated(net);

  ASSERT_TRUE(net.join(newcomer, {0}).status);
  net.run_for(5s);  // no new store: republishing is minutes away
  auto recs = held(net, newcomer, key);
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(as_string(recs[0].body.value), "v");
  EXPECT_GT(recs[0].ttl, 9min);  // the remaining ttl travelled, not a new one
  EXPECT_LE(recs[0].ttl, 10min);
  EXPECT_TRUE(held(net, newcomer, far).empty());  // not among that key's closest
  EXPECT_GE(replicated(net) - before, 1u);
}

// The gap replication closes: sub-keys written before a node joined closer to the key and one
// written after. A get that stops at the newcomer (a dictionary quorum of 1) sees every sub-key
// only if the newcomer received the earlier ones. (Its own get no longer ends at its own copy
// alone, so the newcomer's store is read directly.)
class DhtReplicationDictionary : public ::testing::TestWithParam<bool> {};

TEST_P(DhtReplicationDictionary, GetThroughTheNewcomerSeesEverySubKey) {
  const bool replicate = GetParam();
  auto o = options(replicate);
  SimNetwork net(o);
  net.grow(30);
  const std::size_t newcomer = net.add_node();
  net.run_for(30s);
  const auto key = key_closest_to(net, newcomer, "members-");
  for (std::size_t w = 1; w <= 3; ++w)
    ASSERT_TRUE(store(net, w, key, {entry("p" + std::to_string(w), "alive", w)}).status);
  ASSERT_TRUE(net.join(newcomer, {0}).status);
  net.run_for(5s);
  ASSERT_TRUE(store(net, 4, key, {entry("p4", "alive", 4)}).status);
  net.run_for(5s);

  const auto own = held(net, newcomer, key);
  if (replicate)
    EXPECT_EQ(own.size(), 4u);
  else
    EXPECT_EQ(own.size(), 1u);  // only p4: the partial view without replication on join
  // A plain get from elsewhere sees all four either way (three answers merged).
  auto g = get(net, 5, key);
  ASSERT_TRUE(g.status);
  EXPECT_EQ(g.value.dictionary().size(), 4u);
}

INSTANTIATE_TEST_SUITE_P(Replicate, DhtReplicationDictionary, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "On" : "Off"; });

TEST(DhtReplication, RestartWithTheSameIdentityIsServedAgain) {
  // A restarted node is still in its neighbours' tables (not a newcomer to them); its
  // self-lookup is what tells them its store is empty.
  SimNetwork net(options(true));
  net.grow(30);
  net.run_for(30s);
  const std::size_t n = 7;
  const auto key = key_closest_to(net, n, "restart-");
  ASSERT_TRUE(store(net, 1, key, {entry("a", "1", 1), entry("b", "2", 2)}).status);
  net.run_for(10s);  // past the replication cooldown of the original join
  ASSERT_EQ(held(net, n, key).size(), 2u);
  net.kill(n);
  net.run_for(2s);
  net.restart(n);
  ASSERT_TRUE(held(net, n, key).empty());
  ASSERT_TRUE(net.join(n, {0}).status);
  net.run_for(5s);
  EXPECT_EQ(held(net, n, key).size(), 2u);
}

TEST(DhtReplication, ReplicatedRecordsPassTheReceiversValidators) {
  SimNetwork net(options(true));
  net.grow(20);
  // The newcomer runs a stricter chain: values under "strict/" at most 4 bytes.
  SchemaValidator::Rule rule;
  rule.prefix = "strict/";
  rule.max_value_bytes = 4;
  auto chain = ValidatorChain::standard();
  chain.add(std::make_shared<SchemaValidator>(std::vector<SchemaValidator::Rule>{rule}));
  const std::size_t newcomer = net.add_node(std::nullopt, {}, chain);
  net.run_for(30s);
  const auto big = key_closest_to(net, newcomer, "strict/");
  const auto small = key_closest_to(net, newcomer, "strict/small-");
  ASSERT_TRUE(store(net, 1, big, {plain("too long for it", 1)}).status);
  ASSERT_TRUE(store(net, 1, small, {plain("ok", 1)}).status);
  // A signed owned record keeps its signature on the way.
  const auto owned = RecordKey::from_string("owned-" + owner_marker(net.core(2).peer()));
  const auto version = static_cast<std::uint64_t>(wall_micros(net.now_of(2).wall));
  ASSERT_TRUE(
      store(net, 2, owned,
            {make_signed_record(net.key(2), owned, std::nullopt, to_bytes("mine"), 10min, version)})
          .status);
  net.run_for(5s);
  ASSERT_TRUE(net.join(newcomer, {0}).status);
  net.run_for(5s);
  EXPECT_TRUE(held(net, newcomer, big).empty());  // refused by its validator
  ASSERT_EQ(held(net, newcomer, small).size(), 1u);
  // The owned key is replicated only if the newcomer is among its closest: check what it holds.
  for (const auto& r : held(net, newcomer, owned)) EXPECT_FALSE(r.body.signature.empty());
}

TEST(DhtReplication, ANewcomerGetsABoundedNumberOfRecordsOncePerCooldown) {
  auto o = options(true);
  o.config.replicas = 8;  // a 4-node network: every node is a replica of every key
  o.config.replicate_max_records = 5;
  o.config.replicate_senders = 1;
  SimNetwork net(o);
  net.grow(4);
  const std::size_t newcomer = net.add_node();
  net.run_for(30s);
  for (int k = 0; k < 40; ++k)
    ASSERT_TRUE(
        store(net, 1, RecordKey::from_string("bulk-" + std::to_string(k)), {plain("v", 1)}).status);
  net.run_for(5s);
  const std::uint64_t before = replicated(net);
  ASSERT_TRUE(net.join(newcomer, {0}).status);
  net.run_for(2s);
  const std::size_t got = net.core(newcomer).records().key_count();
  EXPECT_GT(got, 0u);
  EXPECT_LE(got, 5u * 4);  // each of the 4 holders sends at most 5
  const std::uint64_t sent = replicated(net);
  EXPECT_GE(sent - before, got);
  // A second self-lookup inside the cooldown brings nothing more.
  ASSERT_TRUE(net.join(newcomer, {0}).status);
  net.run_for(1s);
  EXPECT_EQ(replicated(net), sent);
  EXPECT_EQ(net.core(newcomer).records().key_count(), got);
}
