// This node's own traffic stays within what receivers accept (max_records_per_store): a store
// of more records than one request may carry, and replication of such a key, arrive whole.
#include <gtest/gtest.h>

#include "sim_helpers.hpp"

using namespace starling;
using namespace starling::dht;
using namespace starling::dht::test;

namespace {
std::vector<Record> entries(std::size_t n) {
  std::vector<Record> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(entry("s" + std::to_string(i), "v", 1, 1h));
  return out;
}
std::size_t full_replicas(SimNetwork& net, const RecordKey& key, std::size_t want) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < net.size(); ++i)
    if (net.alive(i) && net.core(i).records().records(key.id(), net.time()).size() == want) ++n;
  return n;
}
}  // namespace

TEST(DhtStoreLimits, AStoreOfMoreRecordsThanOneRequestCarriesReachesEveryReplicaWhole) {
  SimOptions o;
  o.config = small_config();
  o.config.max_records_per_store = 64;
  auto net = network(30, o);
  const auto key = RecordKey::from_string("big dictionary");
  auto r = store(net, 3, key, entries(150));
  ASSERT_TRUE(r.status) << r.status.error().message();
  net.run_for(5s);
  EXPECT_EQ(full_replicas(net, key, 150), o.config.replicas);
  const auto g = get(net, 17, key, true);
  EXPECT_EQ(g.value.dictionary().size(), 150u);
}

TEST(DhtStoreLimits, ReplicationSplitsAKeyOverSeveralRequests) {
  SimOptions o;
  o.config = small_config();
  o.config.max_records_per_store = 64;
  o.config.replicas = 2;
  o.config.republish_interval = Duration::zero();  // only replication can bring it
  auto net = network(30, o);
  const auto key = RecordKey::from_string("big dictionary to replicate");
  ASSERT_TRUE(store(net, 3, key, entries(150)).status);
  net.run_for(5s);
  const std::size_t before = full_replicas(net, key, 150);
  // Newcomers until one lands among the closest and is sent the key by its holders.
  for (int i = 0; i < 80 && full_replicas(net, key, 150) <= before; ++i) {
    net.grow(1);
    net.run_for(2s);
  }
  EXPECT_GT(full_replicas(net, key, 150), before);
  for (std::size_t i = 0; i < net.size(); ++i) {
    const auto n = net.core(i).records().records(key.id(), net.time()).size();
    EXPECT_TRUE(n == 0 || n == 150) << "node " << i << " holds " << n;
  }
}
