// TrainingNode: everything a networked trainer runs besides the model: an io thread, a libp2p
// Host, a Kademlia DhtNode (bootstrapped through initial peers, or the first node) and a
// NetCollaboration. Used by `starling train` and the collaboration tests.
//
// Threading rule: start() and stop() are called from a thread that is not the node's io
// thread (a main or training thread); the collaboration runs on the io thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "starling/collab/net_collaboration.hpp"
#include "starling/core/blocking.hpp"
#include "starling/crypto/keys.hpp"
#include "starling/net/autonat.hpp"
#include "starling/net/portmap.hpp"
#include "starling/net/relay.hpp"

namespace starling::collab {

struct TrainingNodeConfig {
  std::vector<std::string> listen = {"/ip4/127.0.0.1/tcp/0"};
  std::vector<net::Multiaddr> initial_peers;  // empty: the first node of a network
  dht::DhtNodeConfig dht = default_dht();
  NetCollaborationConfig collab;
  Duration start_timeout = 60s;  // host start + DHT bootstrap
  // Bandwidth limits of the whole host in bytes/s (0: unlimited): every connection's raw TCP
  // bytes (all protocols, handshakes included) share one token bucket per direction.
  std::uint64_t max_upload_bytes_per_second = 0;
  std::uint64_t max_download_bytes_per_second = 0;
  // Serve circuit relay v2 (hop) and AutoNAT to other peers (off by default for trainers;
  // `starling train --relay`).
  bool relay_service = false;
  // Behind a NAT: hold circuit relay v2 reservations with the initial peers (bootstrap nodes
  // relay by default; up to 2 held), waiting up to `relay_wait` at start, and announce the
  // /p2p-circuit addresses (DHT records, averaging entries) so peers can reach this one.
  bool use_relays = false;
  Duration relay_wait = 10s;
  // Ask peers that serve AutoNAT whether this node is publicly reachable, and run the DHT in
  // client mode while it is not (DhtNode::set_reachable). Only for a listening server node.
  bool auto_client_mode = true;
  // DCUtR: upgrade relayed connections to direct ones by TCP hole punching
  // (net::HostConfig::hole_punching).
  bool hole_punching = false;
  // Labs whose "internet" uses private addresses (netlab): the AutoNAT server dials them back
  // and DCUtR offers them (net::AutonatServerConfig / DcutrConfig::allow_private).
  bool allow_private = false;
  // Port mapping through the home router (NAT-PMP / UPnP IGD; `starling train
  // --port-mapping`, auto by default there): the listening port is forwarded and the mapped
  // address announced; only an IPv4 port listening beyond loopback (no mapper otherwise).
  // Off (nullopt) by default here: discovery talks to the LAN's gateway.
  std::optional<net::PortMapConfig> port_mapping;

  static dht::DhtNodeConfig default_dht();
};

class TrainingNode {
 public:
  static result<std::unique_ptr<TrainingNode>> start(crypto::KeyPair key, TrainingNodeConfig cfg);
  ~TrainingNode();  // stop()

  std::shared_ptr<NetCollaboration> collaboration() const { return collab_; }
  // The node's DHT (for other records, e.g. run metrics; used on executor()).
  std::shared_ptr<dht::DhtNode> dht() const { return node_; }
  const net::PeerId& peer() const { return host_->local_peer(); }
  std::shared_ptr<net::Host> host() const { return host_; }
  // The host's announce_addresses() (0.0.0.0 expanded), with /p2p/<id>.
  std::vector<net::Multiaddr> listen_addresses() const;
  asio::any_io_executor executor() { return io_->executor(); }

  // Leaves: stops the collaboration, the DHT node and the host, then the io thread. Bounded
  // by `bound` (each part has its own bound inside). Idempotent.
  result<void> stop(Duration bound = 15s);
  // Bytes sent / received by the collaboration (rounds + state), read on the io thread.
  std::pair<std::uint64_t, std::uint64_t> traffic();

 private:
  TrainingNode() = default;
  std::unique_ptr<IoThread> io_;
  std::shared_ptr<net::Host> host_;
  std::shared_ptr<dht::DhtNode> node_;
  std::shared_ptr<NetCollaboration> collab_;
  std::shared_ptr<net::RelayService> relay_;
  std::shared_ptr<net::AutonatServer> autonat_;
  std::shared_ptr<net::RelayClient> relay_client_;
  std::shared_ptr<net::AutonatClient> autonat_client_;
  std::shared_ptr<net::PortMapper> port_mapper_;
  bool stopped_ = false;
  std::pair<std::uint64_t, std::uint64_t> final_traffic_{0, 0};
};

}  // namespace starling::collab
