// `starling ping ADDR` and `starling echo ADDR TEXT`: dial a node and talk to it.
#include <iostream>

#include <fmt/format.h>
#include <sodium.h>

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
  std::size_t bytes = 0;  // > 0: echo this many random bytes on each stream instead of text
  int streams = 1;
  bool rpc = false;  // use the typed RPC echo instead of the raw echo stream
};

awaitable<result<std::pair<std::shared_ptr<net::Host>, net::PeerId>>> dial(const DialOptions& o) {
  auto key =
      o.identity.empty() ? crypto::KeyPair::generate() : load_identity_or_exit(o.identity, true);
  net::HostConfig cfg;
  cfg.listen.clear();
  auto host = net::Host::create(co_await asio::this_coro::executor, key, cfg);
  ST_CO_TRY(co_await host->start());
  ST_CO_TRY(auto ma, net::Multiaddr::parse(o.addr));
  auto timeout = seconds(o.timeout_s);
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
  auto timeout = seconds(o->timeout_s);
  auto info = co_await host->wait_identified(peer, timeout);
  if (info)
    std::cout << "identify: agent " << info.value().agent_version << ", "
              << info.value().protocols.size() << " protocols\n";
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

awaitable<result<double>> echo_random(net::Host& host, const net::PeerId& peer, std::size_t n,
                                      Duration timeout) {
  Bytes data(n);
  randombytes_buf(data.data(), data.size());
  auto t0 = Clock::now();
  ST_CO_TRY(auto back, co_await net::echo(host, peer, data, timeout));
  if (back != data)
    co_return make_error(errc::protocol_violation,
                         fmt::format("echo returned {} bytes that differ from the {} sent",
                                     back.size(), data.size()));
  co_return std::chrono::duration<double>(Clock::now() - t0).count();
}

awaitable<int> echo_main(std::shared_ptr<DialOptions> o) {
  auto d = co_await dial(*o);
  if (!d) {
    std::cerr << "error: " << d.error().message() << "\n";
    co_return 1;
  }
  auto [host, peer] = d.value();
  auto timeout = seconds(o->timeout_s);
  int code = 0;
  if (o->bytes == 0) {
    net::RpcClient client(*host);
    auto t0 = Clock::now();
    result<Bytes> r = make_error(errc::internal);
    // (No `c ? co_await a : co_await b`: GCC 12 destroys its temporaries too early.)
    if (o->rpc) {
      r = co_await net::rpc_echo(client, peer, as_bytes(o->text), timeout);
    } else {
      r = co_await net::echo(*host, peer, as_bytes(o->text), timeout);
    }
    if (r && o->rpc)
      std::cout << fmt::format(
          "rpc {} answered in {:.3f} ms\n", net::kRpcEchoProtocol,
          std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (!r) {
      std::cerr << "error: " << r.error().message() << "\n";
      code = 1;
    } else {
      std::cout << "echo: " << as_string(r.value()) << "\n";
      if (as_string(r.value()) != o->text) code = 1;
    }
  } else {
    // Several concurrent streams, each echoing its own random payload, verified byte for byte.
    auto ex = co_await asio::this_coro::executor;
    TaskScope scope(ex);
    AsyncEvent done_ev(ex);
    int done = 0, failed = 0;
    double slowest = 0;
    for (int i = 0; i < o->streams; ++i)
      scope.spawn([&, i]() -> awaitable<void> {
        auto r = co_await echo_random(*host, peer, o->bytes, timeout);
        if (!r) {
          ++failed;
          std::cerr << "error: stream " << i << ": " << r.error().message() << "\n";
        } else {
          slowest = std::max(slowest, r.value());
        }
        if (++done == o->streams) done_ev.set();
      });
    (void)co_await done_ev.wait();
    std::cout << fmt::format("echo: {} stream(s) x {} bytes {} in {:.3f} s\n", o->streams, o->bytes,
                             failed ? "FAILED" : "intact", slowest);
    code = failed ? 1 : 0;
  }
  co_await host->stop();
  co_return code;
}

void add_dial_options(CLI::App* cmd, DialOptions& o) {
  cmd->add_option("addr", o.addr,
                  "multiaddr of the node, e.g. /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...")
      ->required();
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
  auto* cmd =
      app.add_subcommand("echo", "dial a node and echo a message through /starling/echo/1.0.0");
  add_dial_options(cmd, *o);
  cmd->add_option("--text", o->text, "message")->capture_default_str();
  cmd->add_flag("--rpc", o->rpc, "call the typed RPC echo (/starling/rpc/echo/1.0.0)");
  cmd->add_option("--bytes", o->bytes, "echo this many random bytes per stream and verify them");
  cmd->add_option("--streams", o->streams, "concurrent streams (with --bytes)")
      ->capture_default_str();
  cmd->callback([&run, o] { run = [o] { return run_main([o] { return echo_main(o); }); }; });
}

}  // namespace starling::cli
