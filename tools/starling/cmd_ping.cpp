// `starling ping ADDR` and `starling echo ADDR TEXT`: dial a node and talk to it.
#include <iostream>

#include <fmt/format.h>

#include "cli.hpp"
#include "starling/net/echo.hpp"
#include "starling/net/host.hpp"

namespace starling::cli {

namespace {
struct DialOptions {
  std::string addr;
  std::string identity;  // empty: ephemeral key
  int count = 5;
  double timeout_s = 10;
  std::string text = "hello from starling";
};

awaitable<result<std::pair<std::shared_ptr<net::Host>, net::PeerId>>> dial(const DialOptions& o) {
  auto key = o.identity.empty() ? crypto::KeyPair::generate() : load_identity_or_exit(o.identity, true);
  net::HostConfig cfg;
  cfg.listen.clear();
  auto host = net::Host::create(co_await asio::this_coro::executor, key, cfg);
  ST_CO_TRY(co_await host->start());
  ST_CO_TRY(auto ma, net::Multiaddr::parse(o.addr));
  auto timeout = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(o.timeout_s));
  auto t0 = Clock::now();
  auto peer = co_await host->connect(ma, timeout);
  if (!peer) {
    co_await host->stop();
    co_return peer.error();
  }
  std::cout << fmt::format("connected to {} in {:.2f} ms\n", peer.value().to_string(),
                           std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  co_return std::make_pair(host, peer.value());
}

awaitable<int> ping_main(std::shared_ptr<DialOptions> o) {
  auto d = co_await dial(*o);
  if (!d) {
    std::cerr << "error: " << d.error().message() << "\n";
    co_return 1;
  }
  auto [host, peer] = d.value();
  auto timeout = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(o->timeout_s));
  auto info = co_await host->wait_identified(peer, timeout);
  if (info) std::cout << "identify: agent " << info.value().agent_version << ", " << info.value().protocols.size() << " protocols\n";
  auto rtts = co_await net::ping(*host, peer, o->count, timeout);
  int code = 0;
  if (!rtts) {
    std::cerr << "error: " << rtts.error().message() << "\n";
    code = 1;
  } else {
    for (std::size_t i = 0; i < rtts.value().size(); ++i)
      std::cout << fmt::format("ping {}: rtt {:.3f} ms\n", i + 1,
                               std::chrono::duration<double, std::milli>(rtts.value()[i]).count());
  }
  co_await host->stop();
  co_return code;
}

awaitable<int> echo_main(std::shared_ptr<DialOptions> o) {
  auto d = co_await dial(*o);
  if (!d) {
    std::cerr << "error: " << d.error().message() << "\n";
    co_return 1;
  }
  auto [host, peer] = d.value();
  auto timeout = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(o->timeout_s));
  auto r = co_await net::echo(*host, peer, as_bytes(o->text), timeout);
  int code = 0;
  if (!r) {
    std::cerr << "error: " << r.error().message() << "\n";
    code = 1;
  } else {
    std::cout << "echo: " << as_string(r.value()) << "\n";
    if (as_string(r.value()) != o->text) code = 1;
  }
  co_await host->stop();
  co_return code;
}

void add_dial_options(CLI::App* cmd, DialOptions& o) {
  cmd->add_option("addr", o.addr, "multiaddr of the node, e.g. /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...")->required();
  cmd->add_option("--identity,-i", o.identity, "identity file (default: a fresh ephemeral key)");
  cmd->add_option("--timeout", o.timeout_s, "seconds")->capture_default_str();
}
}  // namespace

void add_ping_command(CLI::App& app, Runner& run) {
  auto o = std::make_shared<DialOptions>();
  auto* cmd = app.add_subcommand("ping", "dial a node and print round-trip times");
  add_dial_options(cmd, *o);
  cmd->add_option("--count,-n", o->count, "number of pings")->capture_default_str();
  cmd->callback([&run, o] { run = [o] { return run_main([o] { return ping_main(o); }); }; });
}

void add_echo_command(CLI::App& app, Runner& run) {
  auto o = std::make_shared<DialOptions>();
  auto* cmd = app.add_subcommand("echo", "dial a node and echo a message through /starling/echo/1.0.0");
  add_dial_options(cmd, *o);
  cmd->add_option("--text", o->text, "message")->capture_default_str();
  cmd->callback([&run, o] { run = [o] { return run_main([o] { return echo_main(o); }); }; });
}

}  // namespace starling::cli
