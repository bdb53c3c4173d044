// Dashboard (dashboard.hpp): the HTTP server (cpp-httplib), the shared state and the event
// streams. The page and its script are in page.cpp.
#include "starling/monitor/dashboard.hpp"

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>

#include "http_server.hpp"
#include "page.hpp"
#include "starling/core/log.hpp"

namespace starling::monitor {
namespace {

auto log() {
  return logger("monitor");
}

std::int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void no_store(httplib::Response& res) {
  res.set_header("Cache-Control", "no-store");
}

}  // namespace

struct Dashboard::Impl {
  explicit Impl(DashboardConfig c)
      : config(std::move(c)), aggregator(Clock::now(), config.aggregator) {}

  DashboardConfig config;
  httplib::Server server;
  std::thread thread;
  int port = 0;
  std::string chartjs;  // empty: not installed

  mutable std::mutex mutex;
  std::condition_variable changed;
  RunAggregator aggregator;  // guarded by mutex
  std::string json;          // the newest document, guarded by mutex
  std::uint64_t version = 1;
  bool stopping = false;
  DashboardStats stats;

  void refresh_json() { json = to_json(aggregator, config.run_id, unix_ms()); }
  void routes();
  void event_stream(httplib::Response& res);
};

void Dashboard::Impl::routes() {
  server.set_pre_routing_handler([this](const httplib::Request&, httplib::Response& res) {
    {
      std::lock_guard lock(mutex);
      ++stats.requests;
    }
    // The page runs only its own script; peer-supplied text is inserted as text anyway.
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                   "img-src 'self' data:; connect-src 'self'");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Referrer-Policy", "no-referrer");
    return httplib::Server::HandlerResponse::Unhandled;
  });
  server.Get("/", [](const httplib::Request&, httplib::Response& res) {
    no_store(res);
    res.set_content(std::string(page_html()), "text/html; charset=utf-8");
  });
  server.Get("/dashboard.js", [](const httplib::Request&, httplib::Response& res) {
    no_store(res);
    res.set_content(std::string(page_script()), "text/javascript; charset=utf-8");
  });
  server.Get("/chart.js", [this](const httplib::Request&, httplib::Response& res) {
    if (chartjs.empty()) {
      res.status = 404;
      res.set_content("Chart.js is not installed (Debian package libjs-chart.js)", "text/plain");
      return;
    }
    res.set_header("Cache-Control", "max-age=3600");
    res.set_content(chartjs, "text/javascript; charset=utf-8");
  });
  server.Get("/api/state", [this](const httplib::Request&, httplib::Response& res) {
    no_store(res);
    std::string body;
    {
      std::lock_guard lock(mutex);
      body = json;
    }
    res.set_content(std::move(body), "application/json");
  });
  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::string body;
    {
      std::lock_guard lock(mutex);
      body = to_prometheus(aggregator, config.run_id);
    }
    res.set_content(std::move(body), "text/plain; version=0.0.4; charset=utf-8");
  });
  server.Get("/events",
             [this](const httplib::Request&, httplib::Response& res) { event_stream(res); });
}

void Dashboard::Impl::event_stream(httplib::Response& res) {
  {
    std::lock_guard lock(mutex);
    if (stopping || stats.event_streams >= config.max_event_streams) {
      ++stats.refused_streams;
      res.status = 503;
      res.set_content("too many event streams; poll /api/state", "text/plain");
      return;
    }
    ++stats.event_streams;
  }
  no_store(res);
  auto sent = std::make_shared<std::uint64_t>(0);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, sent](std::size_t, httplib::DataSink& sink) {
        std::unique_lock lock(mutex);
        changed.wait_for(lock, config.keepalive, [&] { return stopping || version != *sent; });
        if (stopping) return false;
        if (version == *sent) {
          lock.unlock();
          static constexpr std::string_view kPing = ": keepalive\n\n";
          return sink.write(kPing.data(), kPing.size());
        }
        *sent = version;
        std::string msg = "data: " + json + "\n\n";
        lock.unlock();
        return sink.write(msg.data(), msg.size());
      },
      [this](bool) {
        std::lock_guard lock(mutex);
        --stats.event_streams;
      });
}

result<std::unique_ptr<Dashboard>> Dashboard::start(DashboardConfig config) {
  auto impl = std::make_unique<Impl>(std::move(config));
  auto& c = impl->config;
  if (!c.chartjs_path.empty()) {
    std::ifstream in(c.chartjs_path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (in) impl->chartjs = ss.str();
    if (impl->chartjs.empty())
      log()->warn("dashboard: {} not readable (install libjs-chart.js): no charts", c.chartjs_path);
  }
  impl->refresh_json();
  const std::size_t threads = std::max<std::size_t>(c.threads, c.max_event_streams + 2);
  detail::configure_server(impl->server, threads);
  impl->routes();
  auto bound = detail::bind_and_run(impl->server, c.host, c.port, impl->thread);
  // On an error the server is not running: the Dashboard's stop() joins at once.
  auto dashboard = std::unique_ptr<Dashboard>(new Dashboard(std::move(impl)));
  if (!bound) return bound.error().with_context("dashboard");
  dashboard->impl_->port = bound.value();
  return dashboard;
}

Dashboard::Dashboard(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Dashboard::~Dashboard() {
  stop();
}

int Dashboard::port() const noexcept {
  return impl_->port;
}

std::string Dashboard::url() const {
  return detail::http_url(impl_->config.host, impl_->port);
}

void Dashboard::update(const std::vector<MetricsEntry>& entries) {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->aggregator.update(Clock::now(), entries);
    impl_->refresh_json();
    ++impl_->version;
    ++impl_->stats.updates;
  }
  impl_->changed.notify_all();
}

std::string Dashboard::json() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->json;
}

DashboardStats Dashboard::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}

void Dashboard::stop() {
  if (!impl_) return;
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->stopping && !impl_->thread.joinable()) return;
    impl_->stopping = true;
  }
  impl_->changed.notify_all();
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace starling::monitor
