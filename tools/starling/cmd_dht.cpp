// `starling dht`: run a long-lived DHT (bootstrap) node; `starling dht put|get`: inspect the
// DHT from a short-lived client-mode node.
#include <cstdio>
#include <iostream>

#include <fmt/format.h>

#include "cli.hpp"
#include "monitor_cli.hpp"
#include "starling/core/log.hpp"
#include "starling/dht/node.hpp"
#include "starling/net/autonat.hpp"
#include "starling/net/host.hpp"
#include "starling/net/relay.hpp"

namespace starling::cli {

namespace {
struct DhtOptions {
  std::string identity;  // node: default_identity_path(); put/get: empty = ephemeral key
  std::vector<std::string> listen{"/ip4/0.0.0.0/tcp/0"};
  std::vector<std::string> announce;
  std::vector<std::string> initial_peers;
  std::string addr_file;
  bool client = false;
  bool no_relay = false;       // serve: no circuit relay v2 / AutoNAT service
  bool allow_private = false;  // serve: AutoNAT dials back private addresses (labs)
  // serve: the relay's per-circuit limits (the spec's defaults fit hole punching, not training)
  double circuit_seconds = 120;
  double circuit_kib = 128;
  double timeout_s = 60;  // put/get: overall bound
  // put / get
  std::string key, value, subkey;
  double ttl_s = 3600;
  bool latest = false;
  bool sign = false;
  DashboardOptions dashboard;  // serve: --dashboard HOST:PORT --run-id R
};

result<std::vector<net::Multiaddr>> parse_addrs(const std::vector<std::string>& in,
                                                const char* what) {
  std::vector<net::Multiaddr> out;
  for (const auto& s : in) {
    auto a = net::Multiaddr::parse(s);
    if (!a) return a.error().with_context(std::string(what) + " " + s);
    out.push_back(std::move(a).value());
  }
  return out;
}

void write_addr_file(const std::string& path, const std::string& text) {
  const auto tmp = path + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fputs(text.c_str(), f);
    std::fclose(f);
    std::rename(tmp.c_str(), path.c_str());
  }
}

// Starts a host and a DHT node configured from `o`; prints errors itself.
awaitable<result<std::shared_ptr<dht::DhtNode>>> start_node(const DhtOptions& o,
                                                            crypto::KeyPair key, bool client) {
  ST_CO_TRY(auto announce, parse_addrs(o.announce, "--announce"));
  ST_CO_TRY(auto peers, parse_addrs(o.initial_peers, "--initial-peers"));
  net::HostConfig hc;
  hc.listen = client ? std::vector<std::string>{} : o.listen;
  auto host = net::Host::create(co_await asio::this_coro::executor, key, hc);
  ST_CO_TRY(co_await host->start());
  dht::DhtNodeConfig cfg;
  cfg.dht.client_mode = client;
  cfg.announce = std::move(announce);
  auto node = dht::DhtNode::create(host, cfg);
  auto started = co_await node->start(peers);
  if (!started) {
    co_await node->stop();
    co_await host->stop();
    co_return started.error();
  }
  co_return node;
}

awaitable<void> shutdown(std::shared_ptr<dht::DhtNode> node) {
  co_await node->stop();
  co_await node->host().stop();
}

awaitable<int> serve_main(std::shared_ptr<DhtOptions> o) {
  auto key =
      load_identity_or_exit(o->identity.empty() ? default_identity_path() : o->identity, true);
  auto started = co_await start_node(*o, key, o->client);
  if (!started) {
    std::cerr << "error: " << started.error().message() << "\n";
    co_return 2;
  }
  auto node = started.value();
  // A bootstrap node is public: it relays for peers behind NATs and answers AutoNAT.
  std::shared_ptr<net::RelayService> relay;
  std::shared_ptr<net::AutonatServer> autonat;
  auto host = std::static_pointer_cast<net::Host>(node->host().shared_from_this());
  if (!o->client && !o->no_relay) {
    net::RelayServiceConfig rc;
    rc.circuit_duration = seconds(o->circuit_seconds);
    rc.circuit_data = static_cast<std::uint64_t>(o->circuit_kib * 1024);
    relay = net::RelayService::start(host, rc);
    net::AutonatServerConfig ac;
    ac.allow_private = o->allow_private;
    autonat = net::AutonatServer::start(host, ac);
  }
  // Reachability: a server node that peers' AutoNAT cannot dial back runs in client mode
  // (never in routing tables) until they can again.
  std::shared_ptr<net::AutonatClient> reach;
  if (!o->client) {
    reach = net::AutonatClient::start(host);
    reach->on_change([](net::Reachability r) {
      std::cout << "reachability " << net::reachability_name(r) << std::endl;
    });
    node->follow(*reach);
  }
  std::cout << "peer id " << node->peer().to_string() << "\n";
  std::cout << "mode " << (o->client ? "client" : "server") << "\n";
  std::cout << "relay " << (relay ? "on" : "off") << "\n";
  std::string all;
  for (const auto& a : node->announced()) {
    const auto full = a.with_peer_id(node->peer()).to_string();
    std::cout << "dht address " << full << "\n";
    all += full + "\n";
  }
  std::cout << "routing table " << node->core().routing().size() << " nodes" << std::endl;
  if (!o->addr_file.empty()) write_addr_file(o->addr_file, all);
  // Serve until cancelled (Ctrl-C), with the run's dashboard if asked.
  result<void> served = success();
  if (!o->dashboard.http.empty())
    served = co_await serve_dashboard(node, o->dashboard);
  else
    (void)co_await sleep_for(std::chrono::hours(24 * 365));
  co_await asio::this_coro::reset_cancellation_state();  // Ctrl-C: now clean up, bounded
  if (reach) co_await reach->stop();
  if (autonat) autonat->stop();
  if (relay) co_await relay->stop();
  co_await shutdown(node);
  if (!served) {
    std::cerr << "error: " << served.error().message() << "\n";
    co_return 2;
  }
  std::cout << "stopped" << std::endl;
  co_return 0;
}

std::string show(const Bytes& b) {
  return dht::printable(b, 256);
}

awaitable<result<std::string>> put_op(std::shared_ptr<DhtOptions> o, crypto::KeyPair key) {
  ST_CO_TRY(auto node, co_await start_node(*o, key, true));
  const auto k = dht::RecordKey::from_string(o->key);
  const auto ttl = std::chrono::duration_cast<dht::Millis>(seconds(o->ttl_s));
  std::optional<dht::SubKey> sk;
  if (!o->subkey.empty()) sk = dht::SubKey::from_string(o->subkey);
  result<dht::Stored> r = make_error(errc::internal, "unset");
  if (o->sign) {
    r = co_await node->store_signed(k, sk, to_bytes(o->value), ttl);
  } else if (sk) {
    r = co_await node->store(k, *sk, to_bytes(o->value), ttl);
  } else {
    r = co_await node->store(k, to_bytes(o->value), ttl);
  }
  co_await shutdown(node);
  if (!r) co_return r.error();
  co_return fmt::format("stored {}{} on {} nodes ({} kept something newer), ttl {} s", o->key,
                        sk ? " / " + o->subkey : "", r.value().replicas, r.value().refused,
                        o->ttl_s);
}

awaitable<int> put_main(std::shared_ptr<DhtOptions> o) {
  auto key =
      o->identity.empty() ? crypto::KeyPair::generate() : load_identity_or_exit(o->identity, true);
  auto r = co_await with_timeout(put_op(o, key), seconds(o->timeout_s), "dht put");
  if (!r) {
    std::cerr << "error: " << r.error().message() << "\n";
    co_return 1;
  }
  std::cout << r.value() << std::endl;
  co_return 0;
}

std::string describe_value(const dht::Value& v) {
  return fmt::format("{}  (ttl {:.1f} s, version {}{})", show(v.value), v.ttl.count() / 1000.0,
                     v.version, v.is_signed ? ", signed" : "");
}

awaitable<result<std::optional<dht::Found>>> get_op(std::shared_ptr<DhtOptions> o,
                                                    crypto::KeyPair key) {
  ST_CO_TRY(auto node, co_await start_node(*o, key, true));
  auto r = co_await node->get(dht::RecordKey::from_string(o->key), o->latest);
  co_await shutdown(node);
  co_return r;
}

awaitable<int> get_main(std::shared_ptr<DhtOptions> o) {
  auto key =
      o->identity.empty() ? crypto::KeyPair::generate() : load_identity_or_exit(o->identity, true);
  auto r = co_await with_timeout(get_op(o, key), seconds(o->timeout_s), "dht get");
  if (!r) {
    std::cerr << "error: " << r.error().message() << "\n";
    co_return 1;
  }
  if (!r.value()) {
    std::cout << "not found: " << o->key << std::endl;
    co_return 3;
  }
  const dht::Found& f = *r.value();
  if (f.plain) {
    std::cout << "value " << describe_value(*f.plain) << "\n";
  } else {
    std::cout << "dictionary, " << f.dictionary.size() << " sub-keys\n";
    for (const auto& [sk, v] : f.dictionary)
      std::cout << "subkey " << show(sk.raw()) << " = " << describe_value(v) << "\n";
  }
  std::cout << "hops " << f.hops << std::endl;
  co_return 0;
}

void add_common(CLI::App* cmd, DhtOptions& o) {
  cmd->add_option("--initial-peers,-p", o.initial_peers,
                  "multiaddr of a DHT node to join through (repeatable)");
  cmd->add_option("--timeout", o.timeout_s, "overall time limit, seconds")->capture_default_str();
}
}  // namespace

void add_dht_command(CLI::App& app, Runner& run) {
  auto o = std::make_shared<DhtOptions>();
  auto* cmd = app.add_subcommand("dht", "run a DHT / bootstrap node (put, get: inspect the DHT)");
  cmd->require_subcommand(0, 1);
  cmd->add_option("--identity,-i", o->identity,
                  "identity file (created if missing; default "
                  "~/.starling/identity.key)");
  cmd->add_option("--listen,-l", o->listen, "multiaddr to listen on (repeatable)")
      ->capture_default_str();
  cmd->add_option("--announce,-a", o->announce,
                  "multiaddr to announce to peers (repeatable; default: the listen addresses)");
  cmd->add_option("--initial-peers,-p", o->initial_peers,
                  "multiaddr of a DHT node to join through (repeatable)");
  cmd->add_flag("--client", o->client, "client mode: no listening, never in routing tables");
  cmd->add_flag("--no-relay", o->no_relay,
                "do not serve circuit relay v2 and AutoNAT (on by default: a bootstrap node is "
                "public and relays for peers behind NATs)");
  cmd->add_option("--relay-circuit-seconds", o->circuit_seconds,
                  "relay: reset a circuit after this long (0: no limit)")
      ->capture_default_str();
  cmd->add_option("--relay-circuit-kib", o->circuit_kib,
                  "relay: reset a circuit after this many KiB one way (0: no limit; the "
                  "default suits hole punching, relayed training needs more)")
      ->capture_default_str();
  cmd->add_flag("--allow-private", o->allow_private,
                "AutoNAT: dial back private addresses too (namespace labs)");
  cmd->add_option("--addr-file", o->addr_file, "write the DHT multiaddrs to this file");
  cmd->add_option("--dashboard", o->dashboard.http,
                  "also serve the live dashboard of --run-id on HOST:PORT (as starling monitor)");
  cmd->add_option("--run-id", o->dashboard.run_id, "the run --dashboard shows");
  cmd->add_option("--run-key", o->dashboard.run_key,
                  "a private run's key: --dashboard shows only its members' records");

  auto* put = cmd->add_subcommand("put", "store a value (or a dictionary sub-key) and exit");
  put->add_option("key", o->key, "key")->required();
  put->add_option("value", o->value, "value")->required();
  put->add_option("--subkey,-s", o->subkey, "dictionary sub-key");
  put->add_option("--ttl", o->ttl_s, "time to live, seconds")->capture_default_str();
  put->add_flag("--sign", o->sign,
                "sign with --identity (the key or sub-key must contain [owner:<peer id>])");
  put->add_option("--identity,-i", o->identity, "identity file (default: a fresh key)");
  add_common(put, *o);
  auto* get =
      cmd->add_subcommand("get", "print the value(s) under a key, with sub-keys and remaining ttl");
  get->add_option("key", o->key, "key")->required();
  get->add_flag("--latest", o->latest,
                "ask every closest node and merge (not just the first answers)");
  add_common(get, *o);

  put->callback([&run, o] { run = [o] { return run_main([o] { return put_main(o); }); }; });
  get->callback([&run, o] { run = [o] { return run_main([o] { return get_main(o); }); }; });
  cmd->callback([&run, o, cmd] {
    if (!cmd->get_subcommands().empty()) return;  // put / get
    run = [o] { return run_main([o] { return serve_main(o); }); };
  });
}

}  // namespace starling::cli
