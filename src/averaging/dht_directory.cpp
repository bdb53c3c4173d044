// averaging::Directory over dht::DhtNode (see dht_directory.hpp).
#include "starling/averaging/dht_directory.hpp"

#include <chrono>
#include <string>

namespace starling::averaging {

awaitable<result<void>> DhtDirectory::put(Bytes key, Bytes subkey, Bytes value, WallTime expires) {
  const auto ttl = std::chrono::duration_cast<dht::Millis>(expires - WallClock::now());
  if (ttl <= dht::Millis(0)) co_return success();  // already expired: nothing to publish
  Bytes owned = std::move(subkey);
  const std::string marker = node_->owner_marker();
  owned.insert(owned.end(), marker.begin(), marker.end());
  std::optional<dht::SubKey> sub(dht::SubKey(std::move(owned)));
  auto stored = co_await node_->store_signed(dht::RecordKey(std::move(key)), std::move(sub),
                                             std::move(value), ttl);
  if (!stored) co_return stored.error().with_context("directory put");
  if (stored.value().replicas == 0)
    co_return make_error(errc::unavailable, "directory put: no DHT node took the record");
  co_return success();
}

awaitable<result<std::vector<Bytes>>> DhtDirectory::get(Bytes key) {
  std::vector<Bytes> out;
  auto found = co_await node_->get(dht::RecordKey(std::move(key)), latest_);
  if (!found) co_return found.error().with_context("directory get");
  if (!found.value()) co_return out;  // nobody has the key
  const dht::Found& f = *found.value();
  out.reserve(f.dictionary.size());
  for (const auto& [sub, v] : f.dictionary) out.push_back(v.value);
  co_return out;
}

}  // namespace starling::averaging
