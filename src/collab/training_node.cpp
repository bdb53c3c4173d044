// TrainingNode (training_node.hpp): io thread + Host + DhtNode + NetCollaboration.
#include "starling/collab/training_node.hpp"

#include "starling/core/log.hpp"

namespace starling::collab {

dht::DhtNodeConfig TrainingNodeConfig::default_dht() {
  dht::DhtNodeConfig c;
  c.dht.request_timeout = 5s;
  c.dht.slow_request = 1s;
  c.dht.operation_timeout = 20s;
  c.bootstrap_attempts = 6;
  c.bootstrap_backoff = 300ms;
  c.stop_timeout = 3s;
  return c;
}

result<std::unique_ptr<TrainingNode>> TrainingNode::start(crypto::KeyPair key,
                                                          TrainingNodeConfig cfg) {
  std::unique_ptr<TrainingNode> t(new TrainingNode());
  t->io_ = std::make_unique<IoThread>("starling-train-io");
  net::HostConfig hc;
  hc.listen = cfg.listen;
  hc.shutdown_timeout = 3s;
  hc.max_upload_bytes_per_second = cfg.max_upload_bytes_per_second;
  hc.max_download_bytes_per_second = cfg.max_download_bytes_per_second;
  hc.hole_punching = cfg.hole_punching;
  hc.dcutr.allow_private = cfg.allow_private;
  if (cfg.dht.dht.client_mode || cfg.collab.client_mode) hc.listen.clear();
  t->host_ = net::Host::create(t->io_->executor(), std::move(key), hc);
  auto host = t->host_;
  if (auto r = block_on(
          t->io_->executor(), [host] { return host->start(); }, cfg.start_timeout);
      !r)
    return r.error().with_context("starting the host");
  if (cfg.port_mapping && !net::mappable_ports(host->listen_addresses()).empty()) {
    auto pc = *cfg.port_mapping;
    auto made = block_on(
        t->io_->executor(),
        [host, pc]() -> awaitable<result<std::shared_ptr<net::PortMapper>>> {
          co_return net::PortMapper::start(host, pc);
        },
        5s);
    if (!made) return made.error().with_context("starting the port mapper");
    t->port_mapper_ = made.value();
  }
  if (cfg.relay_service && !hc.listen.empty()) {
    auto made = block_on(
        t->io_->executor(),
        [host, allow = cfg.allow_private]()
            -> awaitable<result<std::pair<std::shared_ptr<net::RelayService>,
                                          std::shared_ptr<net::AutonatServer>>>> {
          net::AutonatServerConfig ac;
          ac.allow_private = allow;
          co_return std::make_pair(net::RelayService::start(host),
                                   net::AutonatServer::start(host, ac));
        },
        5s);
    if (!made) return made.error().with_context("starting the relay service");
    std::tie(t->relay_, t->autonat_) = made.value();
  }
  if (cfg.use_relays && !cfg.initial_peers.empty()) {
    net::RelayClientConfig rc;
    rc.relays = cfg.initial_peers;
    rc.want_reservations = std::min<std::size_t>(2, rc.relays.size());
    auto wait = cfg.relay_wait;
    auto made = block_on(
        t->io_->executor(),
        [host, rc, wait]() -> awaitable<result<std::shared_ptr<net::RelayClient>>> {
          auto c = net::RelayClient::start(host, rc);
          auto held = co_await c->wait_reservations(1, wait);
          if (!held) logger("collab")->warn("no relay reservation yet: {}", held.error().message());
          co_return c;
        },
        wait + 5s);
    if (!made) return made.error().with_context("starting the relay client");
    t->relay_client_ = made.value();
  }
  t->node_ = dht::DhtNode::create(t->host_, cfg.dht);
  auto node = t->node_;
  auto peers = cfg.initial_peers;
  if (auto r = block_on(
          t->io_->executor(), [node, peers] { return node->start(peers); }, cfg.start_timeout);
      !r)
    return r.error().with_context("joining the DHT");
  if (cfg.auto_client_mode && !hc.listen.empty() && !cfg.dht.dht.client_mode) {
    auto made = block_on(
        t->io_->executor(),
        [host, node]() -> awaitable<result<std::shared_ptr<net::AutonatClient>>> {
          auto a = net::AutonatClient::start(host);
          node->follow(*a);
          co_return a;
        },
        5s);
    if (!made) return made.error().with_context("starting the AutoNAT client");
    t->autonat_client_ = made.value();
    // Averaging follows AutoNAT too: while not publicly reachable this peer is a client
    // member (it opens its streams to the owners and owns no part), so no all-reduce stream
    // needs a relay and the relay's circuit limits (128 KiB, 2 min by default) never cut one.
    // A peer that holds relay reservations (behind a NAT, as far as it knows) is a client
    // until AutoNAT finds it public; others own parts until AutoNAT finds them private.
    if (!cfg.collab.client_mode) {
      std::weak_ptr<net::AutonatClient> weak = t->autonat_client_;
      const bool relayed = t->relay_client_ != nullptr;
      cfg.collab.client_now = [weak, relayed] {
        auto a = weak.lock();
        const auto r = a ? a->status() : net::Reachability::unknown;
        return r == net::Reachability::private_ || (relayed && r == net::Reachability::unknown);
      };
      if (relayed)
        logger("collab")->info("averaging: client member until AutoNAT finds this peer public");
      t->autonat_client_->on_change([](net::Reachability r) {
        if (r == net::Reachability::private_)
          logger("collab")->info(
              "averaging: client member (not publicly reachable): sends its values, owns no part");
        else if (r == net::Reachability::public_)
          logger("collab")->info("averaging: full member (publicly reachable): owns parts");
      });
    }
  }
  ST_TRY(auto c, NetCollaboration::create(t->host_, t->node_, cfg.collab));
  t->collab_ = std::move(c);
  return t;
}

TrainingNode::~TrainingNode() {
  (void)stop();
}

std::vector<net::Multiaddr> TrainingNode::listen_addresses() const {
  std::vector<net::Multiaddr> out;
  for (const auto& a : host_->announce_addresses())
    out.push_back(a.with_peer_id(host_->local_peer()));
  return out;
}

std::pair<std::uint64_t, std::uint64_t> TrainingNode::traffic() {
  if (stopped_ || !collab_) return final_traffic_;
  auto c = collab_;
  auto r = block_on(
      io_->executor(),
      [c]() -> awaitable<result<std::pair<std::uint64_t, std::uint64_t>>> {
        co_return std::make_pair(c->bytes_sent(), c->bytes_received());
      },
      5s);
  return r ? r.value() : std::pair<std::uint64_t, std::uint64_t>{0, 0};
}

result<void> TrainingNode::stop(Duration bound) {
  if (stopped_) return success();
  stopped_ = true;
  auto c = collab_;
  auto node = node_;
  auto host = host_;
  auto relay = relay_;
  auto autonat = autonat_;
  auto relay_client = relay_client_;
  auto autonat_client = autonat_client_;
  auto mapper = port_mapper_;
  auto* traffic = &final_traffic_;
  auto r = block_on(
      io_->executor(),
      [c, node, host, relay, autonat, relay_client, autonat_client, mapper,
       traffic]() -> awaitable<result<void>> {
        if (c) *traffic = {c->bytes_sent(), c->bytes_received()};
        if (c) co_await c->stop();
        if (autonat_client) co_await autonat_client->stop();
        if (autonat) autonat->stop();
        if (relay_client) co_await relay_client->stop();
        if (mapper) co_await mapper->stop();
        if (relay) co_await relay->stop();
        if (node) co_await node->stop();
        if (host) co_await host->stop();
        co_return success();
      },
      bound);
  if (!r) logger("collab")->warn("leaving: {}", r.error().message());
  auto s = io_->stop(2s);
  return r ? s : r;
}

}  // namespace starling::collab
