// Helpers of the DhtCore tests on small simulated networks (core_test.cpp, store_test.cpp).
#pragma once

#include <string>
#include <vector>

#include "sim_network.hpp"

namespace starling::dht::test {

inline DhtConfig small_config() {
  DhtConfig c;
  c.k = 8;
  c.replicas = 4;
  return c;
}

// One replica per key and narrow lookups (k = 4, alpha 1): gets walk a path of nodes that do
// not hold the value, where caching along the path shows.
inline SimOptions one_replica_options() {
  SimOptions o;
  o.config = small_config();
  o.config.replicas = 1;
  o.config.k = 4;
  o.config.alpha = 1;
  return o;
}

inline SimNetwork network(std::size_t n, SimOptions o = {}) {
  if (o.config.k == 20) o.config = small_config();
  SimNetwork net(o);
  net.grow(n);
  net.run_for(30s);  // let the join refreshes finish
  return net;
}

inline Record plain(const std::string& v, std::uint64_t version, Millis ttl = 10min) {
  return Record{std::nullopt, RecordBody{to_bytes(v), version, {}, {}}, ttl};
}
inline Record entry(const std::string& sk, const std::string& v, std::uint64_t version,
                    Millis ttl = 10min) {
  return Record{SubKey::from_string(sk), RecordBody{to_bytes(v), version, {}, {}}, ttl};
}

inline OpResult store(SimNetwork& net, std::size_t i, const RecordKey& key,
                      std::vector<Record> recs, StoreOptions opt = {}) {
  return net.run_op(i, [&](DhtCore& c, const Now& now) { return c.store(key, recs, opt, now); });
}
inline OpResult get(SimNetwork& net, std::size_t i, const RecordKey& key, bool latest = false) {
  return net.run_op(i, [&](DhtCore& c, const Now& now) { return c.get(key, {latest}, now); });
}
inline std::string value_of(const OpResult& r) {
  if (!r.status || !r.value.plain()) return "<none>";
  return std::string(as_string(r.value.plain()->body.value));
}
inline std::size_t holders(SimNetwork& net, const RecordKey& key) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < net.size(); ++i)
    if (net.alive(i) && !net.core(i).records().records(key.id(), net.time()).empty()) ++n;
  return n;
}

}  // namespace starling::dht::test
