// The run dashboard as the CLI runs it: `starling monitor` (a client-mode DHT node that only
// reads the run's metrics records) and `starling dht --dashboard` (the same on a serving node).
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "starling/core/async.hpp"
#include "starling/dht/node.hpp"
#include "starling/monitor/dashboard.hpp"

namespace starling::cli {

struct DashboardOptions {
  std::string http;    // "127.0.0.1:8080" (port 0: any free port)
  std::string run_id;  // the run whose records are shown
  double poll_interval = 2;
  std::string chartjs = monitor::DashboardConfig{}.chartjs_path;
  std::string run_key;  // a private run: only its members' records are shown
};

// "HOST:PORT", "[v6]:PORT" or "PORT" (host 127.0.0.1) -> host, port.
result<std::pair<std::string, int>> parse_http_address(const std::string& s);

// Binds the dashboard, prints its address ("dashboard http://...") and polls the run's
// records on `node` until cancelled; then stops the dashboard. Errors are returned before
// anything is served.
awaitable<result<void>> serve_dashboard(std::shared_ptr<dht::DhtNode> node,
                                        const DashboardOptions& o);

}  // namespace starling::cli
