// `starling monitor`: a client-mode DHT node that reads a run's metrics records and serves the
// live dashboard (monitor_cli.hpp); serve_dashboard is shared with `starling dht --dashboard`.
#include <iostream>

#include <fmt/format.h>

#include "cli.hpp"
#include "monitor_cli.hpp"
#include "starling/auth/membership_service.hpp"
#include "starling/core/log.hpp"
#include "starling/monitor/metrics_dht.hpp"
#include "starling/net/host.hpp"

namespace starling::cli {
namespace {

struct MonitorOptions {
  std::vector<std::string> initial_peers;
  DashboardOptions dashboard;
  double start_timeout = 60;
};

// Hands each complete read to the dashboard (a function object: GCC 12 and lambdas in
// coroutines).
// A private run: only members' records (peers not known yet are looked up for the next read).
struct ToDashboard {
  monitor::Dashboard* dashboard;
  std::shared_ptr<auth::MembershipService> members;
  void operator()(std::vector<monitor::MetricsEntry> entries) const {
    if (members) std::erase_if(entries, [this](const auto& e) { return !members->admits(e.peer); });
    dashboard->update(entries);
  }
};

awaitable<result<std::shared_ptr<dht::DhtNode>>> start_client(const MonitorOptions& o) {
  std::vector<net::Multiaddr> peers;
  for (const auto& s : o.initial_peers) {
    auto a = net::Multiaddr::parse(s);
    if (!a) co_return a.error().with_context("--initial-peers " + s);
    peers.push_back(std::move(a).value());
  }
  net::HostConfig hc;
  hc.listen = {};
  auto host =
      net::Host::create(co_await asio::this_coro::executor, crypto::KeyPair::generate(), hc);
  ST_CO_TRY(co_await host->start());
  dht::DhtNodeConfig cfg;
  cfg.dht.client_mode = true;
  auto node = dht::DhtNode::create(host, cfg);
  auto started = co_await node->start(peers);
  if (!started) {
    co_await node->stop();
    co_await host->stop();
    co_return started.error().with_context("joining the DHT");
  }
  co_return node;
}

awaitable<int> monitor_main(std::shared_ptr<MonitorOptions> o) {
  const auto bound = seconds(o->start_timeout);
  auto started = co_await with_timeout(start_client(*o), bound, "starting the monitor's node");
  if (!started) {
    std::cerr << "error: " << started.error().message() << "\n";
    co_return 2;
  }
  auto node = started.value();
  auto served = co_await serve_dashboard(node, o->dashboard);
  co_await asio::this_coro::reset_cancellation_state();  // Ctrl-C: now clean up, bounded
  co_await node->stop();
  co_await node->host().stop();
  if (!served) {
    std::cerr << "error: " << served.error().message() << "\n";
    co_return 2;
  }
  std::cout << "stopped" << std::endl;
  co_return 0;
}

}  // namespace

result<std::pair<std::string, int>> parse_http_address(const std::string& s) {
  std::string host = "127.0.0.1", port = s;
  if (const auto colon = s.rfind(':'); colon != std::string::npos) {
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
      host = host.substr(1, host.size() - 2);
  }
  int p = -1;
  try {
    std::size_t used = 0;
    p = std::stoi(port, &used);
    if (used != port.size()) p = -1;
  } catch (const std::exception&) {
    p = -1;
  }
  if (host.empty() || p < 0 || p > 65535)
    return make_error(errc::invalid_argument,
                      "--http " + s + ": expected HOST:PORT, e.g. 127.0.0.1:8080");
  return std::pair{host, p};
}

awaitable<result<void>> serve_dashboard(std::shared_ptr<dht::DhtNode> node,
                                        const DashboardOptions& o) {
  if (o.run_id.empty()) co_return make_error(errc::invalid_argument, "--run-id is required");
  ST_CO_TRY(auto addr, parse_http_address(o.http));
  monitor::DashboardConfig dc;
  dc.run_id = o.run_id;
  dc.host = addr.first;
  dc.port = addr.second;
  dc.chartjs_path = o.chartjs;
  std::shared_ptr<auth::MembershipService> members;
  if (!o.run_key.empty()) {  // an observer of a private run
    auth::MembershipConfig mc;
    ST_CO_TRY(mc.run_key, auth::parse_run_key(o.run_key));
    ST_CO_TRY(members, auth::MembershipService::create(node, mc));
  }
  auto started = monitor::Dashboard::start(dc);
  if (!started) co_return started.error();
  if (members) members->start();
  auto dashboard = std::move(started).value();
  std::cout << "dashboard " << dashboard->url() << " run " << o.run_id << std::endl;
  monitor::PollerConfig pc;
  pc.run_id = o.run_id;
  pc.interval = seconds(std::max(0.05, o.poll_interval));
  // Polls until cancelled (Ctrl-C).
  co_await monitor::poll_metrics(node, pc, ToDashboard{dashboard.get(), members});
  if (members) co_await members->stop();
  dashboard->stop();
  co_return success();
}

void add_monitor_command(CLI::App& app, Runner& run) {
  auto o = std::make_shared<MonitorOptions>();
  o->dashboard.http = "127.0.0.1:8080";
  auto* cmd = app.add_subcommand(
      "monitor", "serve a live web dashboard of a run (reads the trainers' metrics records)");
  cmd->add_option("--initial-peers,-p", o->initial_peers,
                  "multiaddr of a DHT node of the run (repeatable)")
      ->required();
  cmd->add_option("--run-id,-r", o->dashboard.run_id, "the run to show")->required();
  cmd->add_option("--http", o->dashboard.http,
                  "address the dashboard listens on (HOST:PORT; port 0: any free port)")
      ->capture_default_str();
  cmd->add_option("--poll-interval", o->dashboard.poll_interval,
                  "seconds between reads of the run's records")
      ->capture_default_str();
  cmd->add_option("--run-key", o->dashboard.run_key,
                  "a private run's key: show only its members' records");
  cmd->add_option("--chartjs", o->dashboard.chartjs, "Chart.js file served to the page")
      ->capture_default_str();
  cmd->add_option("--timeout", o->start_timeout, "seconds to join the DHT")->capture_default_str();
  cmd->callback([&run, o] { run = [o] { return run_main([o] { return monitor_main(o); }); }; });
}

}  // namespace starling::cli
