// A trainer's Prometheus endpoint: GET /metrics on HOST:PORT, the text made by a callback at
// each scrape; and a writer of the text exposition format (0.0.4). Read-only; binds where it
// is told (the CLI's default is 127.0.0.1).
//
// Threading rule: the callback runs on the HTTP server's threads (it must guard what it
// reads); stop() may be called from any thread and is idempotent.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "starling/core/result.hpp"

namespace starling::monitor {

class PrometheusText {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  // One family with one sample; `type` is "gauge" or "counter".
  void add(std::string_view name, std::string_view type, std::string_view help, double value,
           const Labels& labels = {});
  const std::string& str() const noexcept { return out_; }

 private:
  std::string out_;
};

// Label values escaped for the text format (backslash, double quote, newline).
std::string prometheus_label(std::string_view value);

class PrometheusEndpoint {
 public:
  static result<std::unique_ptr<PrometheusEndpoint>> start(const std::string& host, int port,
                                                           std::function<std::string()> render);
  ~PrometheusEndpoint();  // stop()
  int port() const noexcept;
  std::string url() const;  // http://host:port/metrics
  void stop();

  struct Impl;

 private:
  explicit PrometheusEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace starling::monitor
