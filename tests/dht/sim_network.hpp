// Test support: a deterministic in-process network of DhtCore nodes with virtual time,
// per-message latency and drops. It drives the very same protocol core as the real node:
// requests polled from one core are delivered (after a random latency, unless dropped) to the
// other core's handle_request, and its response back to on_response; unanswered requests time
// out inside the cores. Everything is seeded, so a run is reproducible.
//
// Threading rule: single-threaded; the test owns it.
#pragma once

#include <cstdlib>
#include <functional>
#include <memory>
#include <queue>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "starling/crypto/keys.hpp"
#include "starling/dht/core.hpp"

namespace starling::dht::test {

struct SimOptions {
  std::uint64_t seed = 1;
  Duration min_latency = 5ms;
  Duration max_latency = 40ms;
  double drop_rate = 0.0;  // probability that one message (request or response) is lost
  bool encode = false;     // pass every message through the wire codec
  DhtConfig config;
};

// Number of nodes for the big simulations: STARLING_SIM_NODES overrides `fallback` (so a slow
// sanitizer build can run them smaller).
inline std::size_t sim_nodes(std::size_t fallback) {
  if (const char* s = std::getenv("STARLING_SIM_NODES")) {
    const long v = std::strtol(s, nullptr, 10);
    if (v > 8) return static_cast<std::size_t>(v);
  }
  return fallback;
}

class SimNetwork {
 public:
  static constexpr std::int64_t kWallEpochMicros = 1'700'000'000'000'000;  // Nov 2023

  explicit SimNetwork(SimOptions o) : opt_(std::move(o)), rng_(opt_.seed) {}

  // Adds a node (not joined yet) whose wall clock is off by `wall_skew`.
  std::size_t add_node(std::optional<DhtConfig> cfg = std::nullopt, Duration wall_skew = {},
                       std::optional<ValidatorChain> validators = std::nullopt) {
    const std::size_t i = nodes_.size();
    Bytes seed(32, 0);
    for (std::size_t b = 0; b < 8; ++b)
      seed[b] = static_cast<std::uint8_t>((opt_.seed * 1000003 + i) >> (8 * b));
    auto key = crypto::KeyPair::from_seed(seed).value();
    auto peer = net::PeerId::from_public_key(key.public_key());
    auto n = std::make_unique<Node>();
    n->key = key;
    n->skew = wall_skew;
    n->core = std::make_unique<DhtCore>(cfg ? *cfg : opt_.config, peer,
                                        validators ? *validators : ValidatorChain::standard(),
                                        opt_.seed * 7919 + i, now_);
    // No addresses: the simulated network routes by peer id (and addresses are opaque to
    // the core anyway); this keeps the 1000-node runs light on copies.
    index_[peer] = i;
    nodes_.push_back(std::move(n));
    schedule_tick(i);
    return i;
  }

  DhtCore& core(std::size_t i) { return *nodes_.at(i)->core; }
  const crypto::KeyPair& key(std::size_t i) const { return nodes_.at(i)->key; }
  Contact contact(std::size_t i) {
    auto& c = core(i);
    return Contact{c.peer(), c.id(), {}};
  }
  std::size_t size() const { return nodes_.size(); }
  bool alive(std::size_t i) const { return nodes_.at(i)->alive; }
  void kill(std::size_t i) { nodes_.at(i)->alive = false; }
  // Node i restarts with the same identity and an empty state (store, table); join it again.
  void restart(std::size_t i) {
    Node& n = *nodes_.at(i);
    const DhtConfig cfg = n.core->config();
    const ValidatorChain v = n.core->validators();
    n.core = std::make_unique<DhtCore>(cfg, n.core->peer(), v, opt_.seed * 7919 + i + 1, now_);
    n.alive = true;
    n.results.clear();
    n.tick_at = TimePoint::max();
    schedule_tick(i);
  }
  TimePoint time() const { return now_; }
  Now now_of(std::size_t i) const {
    const auto since = std::chrono::duration_cast<std::chrono::microseconds>(now_ - start_);
    return Now{now_,
               WallTime(std::chrono::microseconds(kWallEpochMicros) + since +
                        std::chrono::duration_cast<std::chrono::microseconds>(nodes_.at(i)->skew))};
  }
  std::uint64_t messages() const { return delivered_; }
  std::uint64_t dropped() const { return dropped_; }

  // Starts an operation on node i and runs the network until its result is out (or `limit`
  // of virtual time passes: then throws).
  OpResult run_op(std::size_t i, const std::function<OpId(DhtCore&, const Now&)>& start,
                  Duration limit = 10min) {
    const OpId id = start(core(i), now_of(i));
    flush(i);
    return wait_op(i, id, limit);
  }

  // Runs until node i has reported operation `id`.
  OpResult wait_op(std::size_t i, OpId id, Duration limit = 10min) {
    const TimePoint until = now_ + limit;
    auto& done = nodes_.at(i)->results;
    for (;;) {
      if (auto it = done.find(static_cast<std::uint64_t>(id)); it != done.end()) {
        OpResult r = std::move(it->second);
        done.erase(it);
        return r;
      }
      if (events_.empty() || events_.top().at > until)
        throw std::runtime_error("simulated operation did not finish in virtual time");
      step();
    }
  }

  // Starts an operation without waiting (collect it later with wait_op).
  OpId start_op(std::size_t i, const std::function<OpId(DhtCore&, const Now&)>& start) {
    const OpId id = start(core(i), now_of(i));
    flush(i);
    return id;
  }

  // Advances virtual time by `d`, processing everything due.
  void run_for(Duration d) {
    const TimePoint until = now_ + d;
    while (!events_.empty() && events_.top().at <= until) step();
    now_ = until;
  }

  // Joins node i through `seeds` (other node indices) and waits for the bootstrap.
  OpResult join(std::size_t i, const std::vector<std::size_t>& seeds) {
    std::vector<Contact> cs;
    for (auto s : seeds) cs.push_back(contact(s));
    return run_op(i, [&](DhtCore& c, const Now& now) { return c.bootstrap(cs, now); });
  }

  // Adds and joins `n` nodes, each through one random earlier live node.
  void grow(std::size_t n) {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = add_node();
      if (i == 0) continue;
      std::size_t seed;
      do {
        seed = std::uniform_int_distribution<std::size_t>(0, i - 1)(rng_);
      } while (!alive(seed));
      // Like a real node: retry the bootstrap a few times (a message may be lost).
      auto r = join(i, {seed});
      for (int attempt = 1; !r.status && attempt < 5; ++attempt) {
        run_for(1s);
        r = join(i, {seed});
      }
      if (!r.status) throw std::runtime_error("join failed: " + r.status.error().message());
    }
  }

  std::mt19937_64& rng() { return rng_; }

 private:
  struct Node {
    crypto::KeyPair key;
    std::unique_ptr<DhtCore> core;
    Duration skew{};
    bool alive = true;
    TimePoint tick_at = TimePoint::max();
    std::unordered_map<std::uint64_t, OpResult> results;
  };
  enum class Kind { request, response, tick };
  struct Event {
    TimePoint at;
    std::uint64_t seq;
    Kind kind;
    std::size_t from, to;
    std::uint64_t rid;
    std::shared_ptr<Request> req;
    std::shared_ptr<Response> resp;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.at != b.at ? a.at > b.at : a.seq > b.seq;
    }
  };

  Duration latency() {
    const auto lo = opt_.min_latency.count(), hi = opt_.max_latency.count();
    return Duration(std::uniform_int_distribution<Duration::rep>(lo, std::max(lo, hi))(rng_));
  }
  bool drop() {
    return opt_.drop_rate > 0 &&
           std::uniform_real_distribution<double>(0, 1)(rng_) < opt_.drop_rate;
  }
  void push(Event e) {
    e.seq = seq_++;
    events_.push(std::move(e));
  }

  void schedule_tick(std::size_t i) {
    Node& n = *nodes_[i];
    const TimePoint w = std::max(n.core->next_wakeup(), now_);
    if (w >= n.tick_at && n.tick_at >= now_) return;
    n.tick_at = w;
    push(Event{w, 0, Kind::tick, i, i, 0, nullptr, nullptr});
  }

  // Sends what node i queued, collects its results, and re-arms its timer.
  void flush(std::size_t i) {
    Node& n = *nodes_[i];
    while (auto out = n.core->poll_request()) {
      auto it = index_.find(out->to.peer);
      if (it == index_.end() || drop()) {
        ++dropped_;
        continue;
      }
      auto req = std::make_shared<Request>(std::move(out->request));
      if (opt_.encode) req = std::make_shared<Request>(decode_request(encode(*req)).value());
      push(Event{now_ + latency(), 0, Kind::request, i, it->second,
                 static_cast<std::uint64_t>(out->id), std::move(req), nullptr});
    }
    while (auto r = n.core->poll_result())
      n.results.emplace(static_cast<std::uint64_t>(r->id), std::move(*r));
    schedule_tick(i);
  }

  void step() {
    Event e = events_.top();
    events_.pop();
    if (e.at > now_) now_ = e.at;
    switch (e.kind) {
      case Kind::tick: {
        Node& n = *nodes_[e.to];
        if (n.tick_at != e.at) return;  // superseded
        n.tick_at = TimePoint::max();
        if (!n.alive) return;  // a dead node's timers stop
        n.core->tick(now_of(e.to));
        flush(e.to);
        return;
      }
      case Kind::request: {
        if (!alive(e.to)) {
          ++dropped_;
          return;
        }
        ++delivered_;
        Node& n = *nodes_[e.to];
        auto resp = std::make_shared<Response>(
            n.core->handle_request(nodes_[e.from]->core->peer(), *e.req, now_of(e.to)));
        flush(e.to);
        if (drop()) {
          ++dropped_;
          return;
        }
        if (opt_.encode) resp = std::make_shared<Response>(decode_response(encode(*resp)).value());
        push(Event{now_ + latency(), 0, Kind::response, e.to, e.from, e.rid, nullptr,
                   std::move(resp)});
        return;
      }
      case Kind::response: {
        if (!alive(e.to)) return;
        ++delivered_;
        nodes_[e.to]->core->on_response(RequestId{e.rid}, *e.resp, now_of(e.to));
        flush(e.to);
        return;
      }
    }
  }

  SimOptions opt_;
  std::mt19937_64 rng_;
  const TimePoint start_ = TimePoint{} + std::chrono::hours(1);
  TimePoint now_ = start_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::unordered_map<net::PeerId, std::size_t> index_;
  std::priority_queue<Event, std::vector<Event>, Later> events_;
  std::uint64_t seq_ = 0, delivered_ = 0, dropped_ = 0;
};

}  // namespace starling::dht::test
