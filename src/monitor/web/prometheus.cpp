// PrometheusText and PrometheusEndpoint (prometheus.hpp).
#include "starling/monitor/prometheus.hpp"

#include <cmath>
#include <mutex>

#include <fmt/format.h>

#include "http_server.hpp"

namespace starling::monitor {

std::string prometheus_label(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '\\' || c == '"') out += '\\';
    out += c;
  }
  return out;
}

void PrometheusText::add(std::string_view name, std::string_view type, std::string_view help,
                         double value, const Labels& labels) {
  out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}", name, help, name, type, name);
  if (!labels.empty()) {
    out_ += '{';
    for (std::size_t i = 0; i < labels.size(); ++i)
      out_ += fmt::format("{}{}=\"{}\"", i ? "," : "", labels[i].first,
                          prometheus_label(labels[i].second));
    out_ += '}';
  }
  if (std::isnan(value))
    out_ += " NaN\n";
  else if (std::isinf(value))
    out_ += value > 0 ? " +Inf\n" : " -Inf\n";
  else
    out_ += fmt::format(" {}\n", value);
}

struct PrometheusEndpoint::Impl {
  httplib::Server server;
  std::thread thread;
  std::string host;
  int port = 0;
  std::function<std::string()> render;
  std::once_flag stopped;
};

result<std::unique_ptr<PrometheusEndpoint>> PrometheusEndpoint::start(
    const std::string& host, int port, std::function<std::string()> render) {
  auto impl = std::make_unique<Impl>();
  impl->host = host;
  impl->render = std::move(render);
  detail::configure_server(impl->server, 2);
  auto* raw = impl.get();
  impl->server.Get("/metrics", [raw](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_content(raw->render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  auto bound = detail::bind_and_run(impl->server, host, port, impl->thread);
  std::unique_ptr<PrometheusEndpoint> e(new PrometheusEndpoint(std::move(impl)));
  if (!bound) return bound.error().with_context("metrics endpoint");
  e->impl_->port = bound.value();
  return e;
}

PrometheusEndpoint::PrometheusEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PrometheusEndpoint::~PrometheusEndpoint() {
  stop();
}

int PrometheusEndpoint::port() const noexcept {
  return impl_->port;
}

std::string PrometheusEndpoint::url() const {
  return detail::http_url(impl_->host, impl_->port) + "metrics";
}

void PrometheusEndpoint::stop() {
  std::call_once(impl_->stopped, [this] {
    impl_->server.stop();
    if (impl_->thread.joinable()) impl_->thread.join();
  });
}

}  // namespace starling::monitor
