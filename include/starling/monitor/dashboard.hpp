// Dashboard: the run's live web page over HTTP (cpp-httplib), fed by metrics reads. One page
// (HTML + script served by the monitor itself, Chart.js from Debian's libjs-chart.js, no
// CDN), a JSON document, server-sent events for live updates and a Prometheus text endpoint.
// Read-only: GET only; binds to 127.0.0.1 unless told otherwise.
//
//   GET /             the page            GET /api/state   the JSON document (to_json)
//   GET /dashboard.js the page's script   GET /events      server-sent events, one per update
//   GET /chart.js     Chart.js            GET /metrics     Prometheus text (to_prometheus)
//
// Threading rule: the HTTP server runs its own threads; update() may be called from any
// thread (the monitor calls it on the DHT node's executor). All state is behind one mutex.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "starling/core/result.hpp"
#include "starling/monitor/aggregator.hpp"

namespace starling::monitor {

struct DashboardConfig {
  std::string run_id;
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (see Dashboard::port())
  std::string chartjs_path = "/usr/share/javascript/chart.js/chart.min.js";
  std::size_t threads = 8;            // HTTP worker threads
  std::size_t max_event_streams = 4;  // concurrent /events clients (others: 503, then polling)
  Duration keepalive = 15s;           // an event-stream comment when nothing changed
  AggregatorConfig aggregator;
};

struct DashboardStats {
  std::uint64_t requests = 0;
  std::uint64_t updates = 0;
  std::size_t event_streams = 0;  // open now
  std::uint64_t refused_streams = 0;
};

// The dashboard's JSON document (run id, totals, contributors, history; generated_unix_ms:
// the monitor's wall clock when it was made, for latency measurements) and the Prometheus
// text exposition of the totals and contributors (web/dashboard_json.cpp).
std::string to_json(const RunAggregator& a, const std::string& run_id,
                    std::int64_t generated_unix_ms = 0);
std::string to_prometheus(const RunAggregator& a, const std::string& run_id);

class Dashboard {
 public:
  // Binds and starts serving; errors name the address. A missing Chart.js file is not an
  // error (the page shows the numbers without charts; a warning is logged).
  static result<std::unique_ptr<Dashboard>> start(DashboardConfig config);
  ~Dashboard();  // stop()

  int port() const noexcept;
  std::string url() const;  // http://host:port/
  // A complete read of the run's records (RunAggregator::update at Clock::now()).
  void update(const std::vector<MetricsEntry>& entries);
  std::string json() const;
  DashboardStats stats() const;
  // Closes event streams and stops the server; idempotent, bounded by the server's timeouts.
  void stop();

  struct Impl;

 private:
  explicit Dashboard(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace starling::monitor
