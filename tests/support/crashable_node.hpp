// A networked trainer's node for in-process collaboration tests: its own io thread, a libp2p
// Host on loopback (port 0), a DhtNode (the first node of the network, or bootstrapped through
// `bootstrap`) and a NetCollaboration, like collab::TrainingNode, plus crash(): the node
// vanishes as a SIGKILLed process would. Nothing more runs on its io thread (no goodbye, no
// stream or connection close frames, its DHT records stay), then the io_context is torn down,
// which closes its sockets as the kernel would.
//
// Threading rule: start(), stop(), crash() and bytes_sent() are called from a test or training
// thread, never from the node's io thread. Whatever uses collaboration() (a starling::Optimizer)
// must be shut down before stop(), and stopped (its io calls time out) before it is destroyed
// after crash() (see the churn test).
#pragma once

#include <memory>
#include <stdexcept>
#include <vector>

#include "starling/collab/net_collaboration.hpp"
#include "starling/collab/training_node.hpp"
#include "starling/core/blocking.hpp"
#include "starling/crypto/keys.hpp"
#include "starling/dht/node.hpp"
#include "starling/net/host.hpp"
#include "starling/optim/optimizer_options.hpp"

namespace starling::test {

// Optimizer options for a collaboration on loopback: progress refreshed a few times a second
// (DHT round trips take milliseconds here, not the internet's hundreds), rounds of seconds.
inline optim::OptimizerOptions loopback_options(std::string run_id, std::size_t batch) {
  optim::OptimizerOptions o;
  o.run_id = std::move(run_id);
  o.batch_size = batch;
  o.matchmaking_time = 1s;
  o.averaging_timeout = 20s;
  o.load_state_timeout = 30s;
  o.progress.min_refresh = 50ms;
  o.progress.max_refresh = 300ms;
  o.progress.max_publish_interval = 200ms;
  o.progress.stale_after = 4s;
  o.progress_ttl = 10s;
  return o;
}

// The collaboration config for those options (group members silent 6 s are dropped).
inline collab::NetCollaborationConfig loopback_config(const optim::OptimizerOptions& o) {
  collab::NetCollaborationConfig c;
  c.run_id = o.run_id;
  c.stall_timeout = 6s;
  c.open_timeout = 20s;
  return c;
}

class CrashableNode {
 public:
  // Throws std::runtime_error if the host cannot start or the DHT cannot be joined.
  static std::unique_ptr<CrashableNode> start(const std::vector<net::Multiaddr>& bootstrap,
                                              collab::NetCollaborationConfig cfg,
                                              crypto::KeyPair key = crypto::KeyPair::generate()) {
    std::unique_ptr<CrashableNode> n(new CrashableNode());
    n->io_ = std::make_unique<starling::IoThread>("test-node-io");
    net::HostConfig hc;
    hc.listen = {"/ip4/127.0.0.1/tcp/0"};
    hc.shutdown_timeout = 3s;
    n->host_ = net::Host::create(n->io_->executor(), std::move(key), hc);
    auto host = n->host_;
    check(block_on(
              n->io_->executor(), [host] { return host->start(); }, 60s),
          "host start");
    n->dht_ = dht::DhtNode::create(n->host_, collab::TrainingNodeConfig::default_dht());
    auto dht = n->dht_;
    auto peers = bootstrap;
    check(block_on(
              n->io_->executor(), [dht, peers] { return dht->start(peers); }, 60s),
          "DHT bootstrap");
    auto c = collab::NetCollaboration::create(n->host_, n->dht_, std::move(cfg));
    check(c, "collaboration");
    n->collab_ = std::move(c).value();
    return n;
  }
  ~CrashableNode() { stop(); }

  std::shared_ptr<collab::NetCollaboration> collaboration() const { return collab_; }
  std::shared_ptr<dht::DhtNode> dht() const { return dht_; }
  std::vector<net::Multiaddr> listen_addresses() const {
    std::vector<net::Multiaddr> out;
    for (const auto& a : host_->listen_addresses())
      out.push_back(a.with_peer_id(host_->local_peer()));
    return out;
  }

  // The collaboration's own counter of bytes sent (all-reduce streams and state served),
  // read on the io thread; the last value read if the node is gone.
  std::uint64_t bytes_sent() {
    if (!collab_ || io_->stopped()) return last_sent_;
    auto c = collab_;
    auto r = block_on(
        io_->executor(), [c]() -> awaitable<result<std::uint64_t>> { co_return c->bytes_sent(); },
        10s);
    if (r) last_sent_ = r.value();
    return last_sent_;
  }

  // Leaves in order: collaboration, DHT node, host (bounded), then the io thread.
  void stop() {
    if (!io_ || gone_) return;
    gone_ = true;
    (void)bytes_sent();
    {
      // Copies for the io thread, gone before the io_context is: objects destroyed after it
      // touch freed timer services (ASan: heap-use-after-free in ~AsyncEvent).
      auto c = collab_;
      auto dht = dht_;
      auto host = host_;
      (void)block_on(
          io_->executor(),
          [c, dht, host]() -> awaitable<result<void>> {
            co_await c->stop();
            co_await dht->stop();
            co_await host->stop();
            co_return success();
          },
          20s);
    }
    collab_.reset();
    dht_.reset();
    host_.reset();
    (void)io_->stop(2s);
    io_.reset();
  }

  // Dies at once: the io thread stops mid-whatever (pending work is abandoned), then every
  // object and socket of the node is destroyed with its io_context.
  void crash() {
    if (!io_ || gone_) return;
    gone_ = true;
    (void)io_->stop(Duration::zero());
    collab_.reset();
    dht_.reset();
    host_.reset();
    io_.reset();
  }
  // Before crash(): stops the io thread only (the objects are destroyed by crash()).
  void freeze() {
    if (io_) (void)io_->stop(Duration::zero());
  }

 private:
  CrashableNode() = default;
  template <class R>
  static void check(const R& r, const char* what) {
    if (!r) throw std::runtime_error(std::string(what) + ": " + r.error().message());
  }

  std::unique_ptr<starling::IoThread> io_;
  std::shared_ptr<net::Host> host_;
  std::shared_ptr<dht::DhtNode> dht_;
  std::shared_ptr<collab::NetCollaboration> collab_;
  std::uint64_t last_sent_ = 0;
  bool gone_ = false;
};

}  // namespace starling::test
