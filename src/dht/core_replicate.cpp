// DhtCore: replication on join (Kademlia, section 2.5). A node that learns of a newcomer among
// the closest nodes to keys it holds sends it those records, so a node that joins closer to a
// key than the existing replicas holds the key's records without a new store, and a get that
// reaches it first does not stop at an empty or partial dictionary.
//
// When: a node's self-lookup (a find whose target is the sender's own id: what bootstrap sends,
// also after a restart with the same identity and an empty store) or a node entering the
// routing table for the first time. Who sends: for each key held, only a holder among the
// `replicate_senders` closest to the key it knows (the newcomer aside), so a join costs the
// network a copy or two per key, not one per replica. What: the live items with their
// remaining ttl, batched into store requests within the wire limits, at most
// `replicate_max_records` per newcomer and event; a newcomer is served at most once per
// `replicate_cooldown`. The receiver treats them as any store: every record passes its
// validator chain (signatures, owners, sizes, ttl cut to max_ttl) and its store limits.
#include "dht_log.hpp"
#include "starling/dht/core.hpp"

namespace starling::dht {

namespace {
// Bytes a record adds to an encoded store request, roughly (fields and their tags).
std::size_t wire_size(const RecordKey& key, const Record& r) {
  return key.raw().size() + (r.subkey ? r.subkey->raw().size() : 0) + r.body.value.size() +
         r.body.signature.size() + 48;
}
}  // namespace

void DhtCore::replicate_to(const Contact& to, const Now& now) {
  if (!cfg_.replicate_on_join || cfg_.client_mode || to.id == self_.id || store_.key_count() == 0)
    return;
  if (auto it = replicated_.find(to.id); it != replicated_.end() && it->second > now.mono) return;
  replicated_[to.id] = now.mono + cfg_.replicate_cooldown;
  const std::size_t replicas = cfg_.effective_replicas();
  const std::size_t senders = std::max<std::size_t>(cfg_.replicate_senders, 1);
  const std::size_t max_bytes = cfg_.limits.max_message_bytes / 2;
  std::size_t max_records =
      std::min(cfg_.limits.max_records_per_message, cfg_.replicate_max_records);
  if (cfg_.max_records_per_store) max_records = std::min(max_records, cfg_.max_records_per_store);
  StoreRequest batch;
  std::size_t batch_records = 0, batch_bytes = 0, total = 0;
  auto flush = [&] {
    if (batch.items.empty()) return;
    send(to, std::move(batch), Purpose::replicate, 0, now);
    batch = StoreRequest{};
    batch_records = batch_bytes = 0;
  };
  store_.for_each([&](const RecordKey& key, const Slot&) {
    if (total >= cfg_.replicate_max_records) return;
    const DhtId& k = key.id();
    // This node's view of the closest nodes to the key, the newcomer left out.
    const auto view = routing_.closest(k, replicas, to.id);
    std::size_t closer_than_self = 0, closer_than_new = 0;
    for (const auto& c : view) {
      if (closer(k, c.id, self_.id)) ++closer_than_self;
      if (closer(k, c.id, to.id)) ++closer_than_new;
    }
    if (closer(k, self_.id, to.id)) ++closer_than_new;
    if (closer_than_self >= senders || closer_than_new >= replicas) return;
    auto records = store_.records(k, now.mono);
    if (records.empty()) return;
    if (records.size() + total > cfg_.replicate_max_records) return;
    // Record by record: a key with more records than one request may carry (the receiver's
    // max_records_per_store) spreads over several.
    for (auto& r : records) {
      const std::size_t bytes = wire_size(key, r);
      if (bytes > max_bytes) continue;  // alone too big: skip it
      if (batch_records + 1 > max_records || batch_bytes + bytes > max_bytes) flush();
      if (batch.items.empty() || batch.items.back().key.id() != k)
        batch.items.push_back(StoreItem{key, {}});
      batch.items.back().records.push_back(std::move(r));
      ++batch_records;
      batch_bytes += bytes;
      ++total;
    }
  });
  flush();
  if (total > 0) {
    replicated_records_ += total;
    if (dht_log().should_log(spdlog::level::debug))
      dht_log().debug("replicating {} records to newcomer {}", total, to.peer.short_string());
  }
}

void DhtCore::expire_replicated(const Now& now) {
  std::erase_if(replicated_, [&](const auto& e) { return e.second <= now.mono; });
}

}  // namespace starling::dht
