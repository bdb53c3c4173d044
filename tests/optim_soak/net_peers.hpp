// Fashion-MNIST peers over the real network: each a FashionPeer (training thread, Optimizer)
// on its own CrashableNode (io thread, Host on loopback, DhtNode, NetCollaboration). The first
// peer of a test is the DHT's first node; the others bootstrap through live peers.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "optim/fashion_peers.hpp"
#include "support/crashable_node.hpp"

namespace starling::test {

inline optim::OptimizerOptions net_options(std::uint64_t target, std::size_t batch) {
  auto o = loopback_options("fashion-net", batch);
  o.target_batch_size = target;
  return o;
}

class NetFashionPeer {
 public:
  NetFashionPeer(const FashionSetup& s, const std::vector<net::Multiaddr>& bootstrap,
                 const optim::OptimizerOptions& o, std::uint64_t model_seed,
                 std::uint64_t data_seed)
      : node_(CrashableNode::start(bootstrap, loopback_config(o))),
        peer_(std::make_unique<FashionPeer>(s, node_->collaboration(), o, model_seed, data_seed)) {}
  // Leaves cleanly (a peer still alive at the end).
  ~NetFashionPeer() {
    if (!crashed_) leave();
  }

  FashionPeer& peer() { return *peer_; }
  FashionPeer* operator->() { return peer_.get(); }
  std::vector<net::Multiaddr> addresses() const { return node_->listen_addresses(); }
  // Bytes this peer's collaboration sent (its own counters).
  std::uint64_t bytes_sent() { return node_->bytes_sent(); }
  bool crashed() const { return crashed_; }

  void leave() {
    peer_->stop();
    peer_->join();
    peer_->drop_optimizer(10s);
    node_->stop();
  }

  // Dies abruptly right after it began matchmaking for a round (so the others are counting on
  // it): its training ends, its io thread stops mid-matchmaking, and its node is torn down with
  // no goodbye. The optimizer is destroyed while the io thread is stopped (its shutdown times
  // out: nothing is sent). False if the peer never reached a matchmaking step within `limit`.
  bool crash_at_matchmaking(Duration limit) {
    peer_->stop_at_matchmaking();
    const bool at_matchmaking = wait_for([&] { return peer_->finished.load(); }, limit);
    peer_->stop();
    peer_->join();
    (void)node_->bytes_sent();  // the last count, kept for the report
    node_->freeze();
    peer_->drop_optimizer(Duration::zero());
    node_->crash();
    crashed_ = true;
    return at_matchmaking;
  }

 private:
  std::unique_ptr<CrashableNode> node_;
  std::unique_ptr<FashionPeer> peer_;
  bool crashed_ = false;
};

// Addresses of every peer not crashed (initial peers for a joiner).
inline std::vector<net::Multiaddr> live_addresses(
    const std::vector<std::unique_ptr<NetFashionPeer>>& peers) {
  std::vector<net::Multiaddr> out;
  for (const auto& p : peers)
    if (!p->crashed())
      for (auto& a : p->addresses()) out.push_back(a);
  return out;
}

}  // namespace starling::test
