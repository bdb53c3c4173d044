// DhtNode: bootstrap, store, get, find_node, owned-record helpers, and the blocking facade.
#include <algorithm>

#include <fmt/format.h>

#include "dht_log.hpp"
#include "starling/dht/node.hpp"
#include "starling/dht/signing.hpp"

namespace starling::dht {

awaitable<result<std::vector<Contact>>> DhtNode::seeds_of(
    const std::vector<net::Multiaddr>& addrs) {
  std::vector<Contact> seeds;
  std::string why;
  for (const auto& a : addrs) {
    std::optional<net::PeerId> id = a.peer_id();
    if (!id) {  // no /p2p/<id>: connect to learn who answers there
      auto r = co_await host_->connect(a, cfg_.dial_timeout);
      if (!r) {
        why = a.to_string() + ": " + r.error().message();
        continue;
      }
      id = r.value();
    }
    if (*id == peer()) {  // ourselves: our own address, or another process with our identity
      why = a.to_string() +
            " has this node's own peer id (a second process with the same "
            "identity? give this one another --identity)";
      continue;
    }
    const net::Multiaddr bare = a.without_peer_id();
    host_->add_addresses(*id, {bare});
    std::vector<Bytes> bin{bare.to_bytes()};
    seeds.push_back(Contact::of(*id, std::move(bin)));
  }
  if (seeds.empty()) {
    // Only ourselves: retrying cannot help.
    const bool only_self = !addrs.empty() && std::all_of(addrs.begin(), addrs.end(), [&](auto& a) {
      return a.peer_id() == std::optional<net::PeerId>(peer());
    });
    co_return make_error(only_self ? errc::invalid_argument : errc::unavailable,
                         "no usable initial peer" + (why.empty() ? "" : " (" + why + ")"));
  }
  co_return seeds;
}

awaitable<result<void>> DhtNode::bootstrap(std::vector<net::Multiaddr> initial_peers) {
  if (initial_peers.empty())
    co_return make_error(errc::invalid_argument, "dht bootstrap: no initial peers given");
  if (!started_ || stopping_) co_return make_error(errc::invalid_argument, "dht node not running");
  const std::size_t attempts = std::max<std::size_t>(cfg_.bootstrap_attempts, 1);
  Duration backoff = cfg_.bootstrap_backoff;
  std::string last;
  for (std::size_t attempt = 0; attempt < attempts && !stopping_; ++attempt) {
    if (attempt > 0) {
      dht_log().info("dht bootstrap attempt {} failed ({}); retrying in {} ms", attempt, last,
                     std::chrono::duration_cast<Millis>(backoff).count());
      ST_CO_TRY(co_await sleep_for(backoff));
      backoff = std::min<Duration>(backoff * 2, 10s);
    }
    auto seeds = co_await seeds_of(initial_peers);
    if (!seeds) {
      if (seeds.error() == errc::invalid_argument)
        co_return make_error(errc::invalid_argument, "dht bootstrap: " + seeds.error().message());
      last = seeds.error().message();
      continue;
    }
    const OpId id = core_.bootstrap(std::move(seeds).value(), now());
    OpResult r = co_await wait_op(id, add_waiter(id));
    if (r.status) {
      dht_log().info("dht node {} bootstrapped: {} nodes in its routing table",
                     peer().short_string(), core_.routing().size());
      co_return success();
    }
    last = r.status.error().message();
  }
  co_return make_error(errc::unavailable,
                       fmt::format("dht bootstrap: none of the {} initial peers answered after {} "
                                   "attempts (last: {})",
                                   initial_peers.size(), attempts, last));
}

awaitable<OpResult> DhtNode::run_store(RecordKey key, std::vector<Record> records,
                                       StoreOptions options) {
  if (!started_ || stopping_) {
    OpResult r;
    r.status = make_error(errc::invalid_argument, "dht node not running");
    co_return r;
  }
  const OpId id = core_.store(key, std::move(records), options, now());
  co_return co_await wait_op(id, add_waiter(id));
}

awaitable<result<Stored>> DhtNode::store_records(RecordKey key, std::vector<Record> records,
                                                 StoreOptions options) {
  OpResult r = co_await run_store(std::move(key), std::move(records), options);
  if (!r.status) co_return r.status.error();
  co_return Stored{r.stored, r.refused};
}

awaitable<result<Stored>> DhtNode::store(RecordKey key, Bytes value, Millis ttl) {
  Record rec;
  rec.body.value = std::move(value);
  rec.body.version = core_.version_clock().next(WallClock::now());
  rec.ttl = ttl;
  std::vector<Record> recs{std::move(rec)};
  co_return co_await store_records(std::move(key), std::move(recs));
}

awaitable<result<Stored>> DhtNode::store(RecordKey key, SubKey subkey, Bytes value, Millis ttl) {
  Record rec;
  rec.subkey = std::move(subkey);
  rec.body.value = std::move(value);
  rec.body.version = core_.version_clock().next(WallClock::now());
  rec.ttl = ttl;
  std::vector<Record> recs{std::move(rec)};
  co_return co_await store_records(std::move(key), std::move(recs));
}

awaitable<result<Stored>> DhtNode::store_signed(RecordKey key, std::optional<SubKey> subkey,
                                                Bytes value, Millis ttl) {
  const std::uint64_t version = core_.version_clock().next(WallClock::now());
  Record rec =
      make_signed_record(host_->key(), key, std::move(subkey), std::move(value), ttl, version);
  std::vector<Record> recs{std::move(rec)};
  co_return co_await store_records(std::move(key), std::move(recs));
}

awaitable<result<std::optional<Found>>> DhtNode::get(RecordKey key, bool latest) {
  if (!started_ || stopping_) co_return make_error(errc::invalid_argument, "dht node not running");
  GetOptions go;
  go.latest = latest;
  const OpId id = core_.get(key, go, now());
  OpResult r = co_await wait_op(id, add_waiter(id));
  if (!r.status) {
    if (r.status.error() == errc::not_found) co_return std::optional<Found>{};
    co_return r.status.error();
  }
  Found f;
  f.hops = r.stats.hops;
  for (auto& rec : r.value.to_records(Clock::now())) {
    Value v{std::move(rec.body.value), rec.ttl, rec.body.version, !rec.body.signature.empty()};
    if (rec.subkey)
      f.dictionary.emplace(std::move(*rec.subkey), std::move(v));
    else
      f.plain = std::move(v);
  }
  if (!f.dictionary.empty()) f.plain.reset();  // a non-empty dictionary is the value
  if (!f.plain && f.dictionary.empty()) co_return std::optional<Found>{};  // expired meanwhile
  co_return std::optional<Found>(std::move(f));
}

awaitable<result<std::vector<Contact>>> DhtNode::find_node(DhtId target) {
  if (!started_ || stopping_) co_return make_error(errc::invalid_argument, "dht node not running");
  const OpId id = core_.find_node(target, now());
  OpResult r = co_await wait_op(id, add_waiter(id));
  if (!r.status) co_return r.status.error();
  co_return std::move(r.closest);
}

std::string DhtNode::owner_marker() const {
  return dht::owner_marker(peer());
}
RecordKey DhtNode::owned_key(std::string_view name) const {
  return RecordKey::from_string(std::string(name) + owner_marker());
}
SubKey DhtNode::owned_subkey(std::string_view name) const {
  return SubKey::from_string(std::string(name) + owner_marker());
}

// ---------------------------------------------------------------- blocking facade

result<void> BlockingDhtNode::bootstrap(std::vector<net::Multiaddr> initial_peers) {
  const auto& c = node_->config();
  const Duration bound =
      (c.dht.operation_timeout + c.dial_timeout * static_cast<long>(initial_peers.size()) + 10s) *
      static_cast<long>(std::max<std::size_t>(c.bootstrap_attempts, 1));
  return block_on(
      node_->executor(), [n = node_, p = std::move(initial_peers)]() { return n->bootstrap(p); },
      bound);
}

result<Stored> BlockingDhtNode::store(RecordKey key, Bytes value, Millis ttl) {
  return block_on(
      node_->executor(),
      [n = node_, k = std::move(key), v = std::move(value), ttl]() { return n->store(k, v, ttl); },
      bound());
}

result<Stored> BlockingDhtNode::store(RecordKey key, SubKey subkey, Bytes value, Millis ttl) {
  return block_on(
      node_->executor(),
      [n = node_, k = std::move(key), s = std::move(subkey), v = std::move(value), ttl]() {
        return n->store(k, s, v, ttl);
      },
      bound());
}

result<Stored> BlockingDhtNode::store_signed(RecordKey key, std::optional<SubKey> subkey,
                                             Bytes value, Millis ttl) {
  return block_on(
      node_->executor(),
      [n = node_, k = std::move(key), s = std::move(subkey), v = std::move(value), ttl]() {
        return n->store_signed(k, s, v, ttl);
      },
      bound());
}

result<std::optional<Found>> BlockingDhtNode::get(RecordKey key, bool latest) {
  return block_on(
      node_->executor(), [n = node_, k = std::move(key), latest]() { return n->get(k, latest); },
      bound());
}

}  // namespace starling::dht
