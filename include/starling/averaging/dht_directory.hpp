// DhtDirectory: the averaging::Directory seam on the Kademlia DHT (dht::DhtNode). Each
// directory key is a DHT dictionary record; put() stores one sub-key, get() returns the live
// sub-keys' values.
//
// Clock safety: the Directory API takes an absolute expiry on this machine's wall clock; it is
// turned into a time-to-live here, and the DHT carries only TTLs, so peers with skewed clocks
// agree on what is live.
// Authenticity: every sub-key is stored signed by this node's Ed25519 key (the DHT sub-key is
// the caller's sub-key followed by the DHT's owner marker), so no other peer can overwrite or
// forge this node's entries; readers only see values, so callers are unaffected.
//
// Threading rule: call from the DhtNode's executor (the node's io thread).
#pragma once

#include <memory>

#include "starling/averaging/directory.hpp"
#include "starling/dht/node.hpp"

namespace starling::averaging {

class DhtDirectory final : public Directory {
 public:
  // `latest`: gets ask every closest replica and merge (slower, never misses a fresh entry),
  // instead of stopping at the first answers.
  explicit DhtDirectory(std::shared_ptr<dht::DhtNode> node, bool latest = true)
      : node_(std::move(node)), latest_(latest) {}

  // errc::unavailable when no DHT node (not even this one) took the record.
  awaitable<result<void>> put(Bytes key, Bytes subkey, Bytes value, WallTime expires) override;
  awaitable<result<std::vector<Bytes>>> get(Bytes key) override;

  dht::DhtNode& node() noexcept { return *node_; }

 private:
  std::shared_ptr<dht::DhtNode> node_;
  bool latest_;
};

}  // namespace starling::averaging
