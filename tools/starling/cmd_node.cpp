// `starling node`: run a libp2p node, print its multiaddrs, serve identify/ping/echo.
#include <iostream>

#include <fmt/format.h>

#include "cli.hpp"
#include "starling/core/log.hpp"
#include "starling/net/autonat.hpp"
#include "starling/net/echo.hpp"
#include "starling/net/host.hpp"
#include "starling/net/portmap.hpp"
#include "starling/net/relay.hpp"

namespace starling::cli {

namespace {
struct NodeOptions {
  std::string identity = default_identity_path();
  std::vector<std::string> listen{"/ip4/0.0.0.0/tcp/0"};
  std::vector<std::string> connect;
  std::vector<std::string> relay_via;
  std::size_t reservations = 0;  // 0: one with every --relay-via relay
  std::string addr_file;
  bool relay = false;
  bool hole_punching = false;
  bool allow_private = false;
  std::string port_mapping = "auto";
  double port_mapping_lifetime = 3600;
  double ping_every = 0;
};

// Pings `peer` every `every` until cancelled, printing the RTT and the kind of connection
// new streams use (a direct one when there is one: Host prefers it).
awaitable<void> ping_loop(std::shared_ptr<net::Host> host, net::PeerId peer, Duration every) {
  for (int i = 1;; ++i) {
    auto r = co_await net::ping(*host, peer, 1, 5s);
    bool direct = false;
    for (const auto& c : host->connections()) direct = direct || (c.peer == peer && !c.relayed);
    if (r && !r.value().empty())
      std::cout << fmt::format("ping {} {}: rtt {:.3f} ms via {}", peer.to_string(), i,
                               std::chrono::duration<double, std::milli>(r.value()[0]).count(),
                               direct ? "direct" : "relayed")
                << std::endl;
    else if (!r)
      std::cout << fmt::format("ping {} {}: {}", peer.to_string(), i, r.error().message())
                << std::endl;
    if (!co_await sleep_for(every)) co_return;
  }
}

// Prints the router's mappings once granted, with the addresses now announced (the node's
// other lines do not wait for the router: one that never answers costs nothing).
awaitable<void> report_mapping(std::shared_ptr<net::Host> host,
                               std::shared_ptr<net::PortMapper> mapper, Duration timeout) {
  if (!co_await mapper->wait_mapped(timeout)) {
    std::cout << "port mapping none yet" << std::endl;
    co_return;
  }
  for (const auto& pm : mapper->mappings())
    std::cout << fmt::format("port mapped {} {}:{} -> {}", mapper->protocol(),
                             pm.external_ip.to_string(), pm.external_port, pm.internal_port)
              << std::endl;
  for (const auto& pm : mapper->mappings()) {
    const auto a =
        net::Multiaddr::from_tcp_endpoint({asio::ip::address(pm.external_ip), pm.external_port});
    for (const auto& b : host->announce_addresses())
      if (b.without_peer_id() == a) std::cout << "listening on " << b.to_string() << std::endl;
  }
}

awaitable<int> node_main(std::shared_ptr<NodeOptions> o) {
  auto key = load_identity_or_exit(o->identity, true);
  auto portmap = net::port_map_mode(o->port_mapping);
  if (!portmap) {
    std::cerr << "error: --port-mapping: " << portmap.error().message() << "\n";
    co_return 2;
  }
  net::HostConfig cfg;
  cfg.listen = o->listen;
  cfg.hole_punching = o->hole_punching;
  cfg.dcutr.allow_private = o->allow_private;
  auto host = net::Host::create(co_await asio::this_coro::executor, key, cfg);
  auto started = co_await host->start();
  if (!started) {
    std::cerr << "error: " << started.error().message() << "\n";
    co_return 2;
  }
  net::install_echo(*host);
  std::shared_ptr<net::RelayService> relay;
  std::shared_ptr<net::AutonatServer> autonat;
  if (o->relay) {
    relay = net::RelayService::start(host);
    net::AutonatServerConfig ac;
    ac.allow_private = o->allow_private;
    autonat = net::AutonatServer::start(host, ac);
  }
  // Reachability: asks connected peers that serve AutoNAT to dial back; prints each change.
  auto autonat_client = net::AutonatClient::start(host);
  autonat_client->on_change([](net::Reachability r) {
    std::cout << "reachability " << net::reachability_name(r) << std::endl;
  });
  // Port mapping through the home router (only for ports listening beyond loopback): the
  // mapped address is announced once granted.
  TaskScope background(co_await asio::this_coro::executor);
  std::shared_ptr<net::PortMapper> mapper;
  if (portmap.value() && !net::mappable_ports(host->listen_addresses()).empty()) {
    auto pc = *portmap.value();
    pc.allow_private = o->allow_private;
    pc.lifetime = seconds(o->port_mapping_lifetime);
    mapper = net::PortMapper::start(host, pc);
    background.spawn(report_mapping(host, mapper, pc.discover_timeout + pc.request_timeout));
  }
  std::shared_ptr<net::RelayClient> relay_client;
  if (!o->relay_via.empty()) {
    net::RelayClientConfig rc;
    for (const auto& s : o->relay_via) {
      auto ma = net::Multiaddr::parse(s);
      if (!ma || !ma.value().peer_id()) {
        std::cerr << "error: --relay-via " << s << ": needs a multiaddr with /p2p/<id>\n";
        co_return 2;
      }
      rc.relays.push_back(ma.value());
    }
    rc.want_reservations = o->reservations > 0 ? o->reservations : rc.relays.size();
    relay_client = net::RelayClient::start(host, rc);
    auto held = co_await relay_client->wait_reservations(1, 30s);
    if (!held) std::cerr << "warning: " << held.error().message() << "\n";
  }
  net::RpcServer rpc(*host);
  net::install_rpc_echo(rpc);
  host->on_peer_connected(
      [](const net::PeerId& p) { std::cout << "connected " << p.to_string() << std::endl; });
  host->on_peer_disconnected(
      [](const net::PeerId& p) { std::cout << "disconnected " << p.to_string() << std::endl; });
  // t=: milliseconds since the node started (bench/run-nat.sh times hole punches with it).
  host->on_connection_opened([t0 = Clock::now()](const net::ConnectionInfo& c) {
    std::cout << fmt::format("connection {} {} {} {} t={:.1f}", c.peer.to_string(),
                             c.relayed ? "relayed" : "direct", c.outbound ? "outbound" : "inbound",
                             c.remote_addr.to_string(),
                             std::chrono::duration<double, std::milli>(Clock::now() - t0).count())
              << std::endl;
  });
  std::cout << "peer id " << host->local_peer().to_string() << "\n";
  std::string all;
  for (auto& a : host->announce_addresses()) {
    std::cout << (a.is_circuit() ? "relayed at " : "listening on ") << a.to_string() << "\n";
    all += a.to_string() + "\n";
  }
  std::cout << std::flush;
  if (!o->addr_file.empty()) {
    auto tmp = o->addr_file + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (f) {
      std::fputs(all.c_str(), f);
      std::fclose(f);
      std::rename(tmp.c_str(), o->addr_file.c_str());
    }
  }
  TaskScope pings(co_await asio::this_coro::executor);
  for (auto& c : o->connect) {
    auto ma = net::Multiaddr::parse(c);
    if (!ma) {
      std::cerr << "error: --connect " << c << ": " << ma.error().message() << "\n";
      continue;
    }
    auto r = co_await host->connect(ma.value());
    if (r)
      std::cout << "dialled " << r.value().to_string() << std::endl;
    else
      std::cerr << "error: " << r.error().message() << std::endl;
    if (r && o->ping_every > 0) pings.spawn(ping_loop(host, r.value(), seconds(o->ping_every)));
  }
  // Serve until cancelled (Ctrl-C).
  (void)co_await sleep_for(std::chrono::hours(24 * 365));
  co_await asio::this_coro::reset_cancellation_state();  // Ctrl-C: now clean up, bounded
  (void)co_await pings.close(2s);
  (void)co_await background.close(2s);
  co_await autonat_client->stop();
  if (mapper) co_await mapper->stop();
  if (relay_client) co_await relay_client->stop();
  if (autonat) autonat->stop();
  if (relay) co_await relay->stop();
  co_await host->stop();
  std::cout << "stopped" << std::endl;
  co_return 0;
}
}  // namespace

void add_node_command(CLI::App& app, Runner& run) {
  auto o = std::make_shared<NodeOptions>();
  auto* cmd =
      app.add_subcommand("node", "run a node: print its multiaddrs, serve ping/identify/echo");
  cmd->add_option("--identity,-i", o->identity, "identity file (created if missing)")
      ->capture_default_str();
  cmd->add_option("--listen,-l", o->listen, "multiaddr to listen on (repeatable)")
      ->capture_default_str();
  cmd->add_option("--connect,-c", o->connect, "multiaddr to dial at start (repeatable)");
  cmd->add_option("--addr-file", o->addr_file, "write the listen multiaddrs to this file");
  cmd->add_flag("--relay", o->relay, "serve circuit relay v2 and AutoNAT to other peers");
  cmd->add_option("--relay-via", o->relay_via,
                  "hold a relay reservation with this relay (multiaddr with /p2p/<id>; "
                  "repeatable); the /p2p-circuit addresses are printed and announced");
  cmd->add_option("--reservations", o->reservations,
                  "reservations to hold among the --relay-via relays (0: all); when a relay "
                  "dies the client reserves with another one");
  cmd->add_flag("--hole-punching", o->hole_punching,
                "DCUtR: upgrade relayed connections to direct ones by TCP hole punching "
                "(listeners get SO_REUSEPORT)");
  cmd->add_flag("--allow-private", o->allow_private,
                "treat private addresses as public for AutoNAT dial-backs and DCUtR "
                "(namespace labs)");
  cmd->add_option("--port-mapping", o->port_mapping,
                  "ask the home router to forward the listening ports: auto (PCP, NAT-PMP, then "
                  "UPnP IGD), pcp, natpmp, upnp or off; only IPv4 ports listening beyond loopback "
                  "are mapped; the mapped address is announced")
      ->capture_default_str();
  cmd->add_option("--port-mapping-lifetime", o->port_mapping_lifetime,
                  "lease asked for each mapping, seconds (renewed at half of what is granted)")
      ->capture_default_str();
  cmd->add_option("--ping-every", o->ping_every,
                  "ping each --connect peer every this many seconds, printing the RTT and "
                  "whether new streams go direct or relayed");
  cmd->callback([&run, o] { run = [o] { return run_main([o] { return node_main(o); }); }; });
}

}  // namespace starling::cli
