// Dashboard over HTTP on 127.0.0.1 port 0: the page, its script, Chart.js, the JSON document,
// the Prometheus text, server-sent events and the stream limit.
#include <gtest/gtest.h>

#include <httplib.h>

#include <cmath>
#include <thread>

#include "starling/monitor/dashboard.hpp"
#include "starling/monitor/prometheus.hpp"

using namespace starling;
using namespace starling::monitor;

namespace {

MetricsEntry entry(std::uint64_t epoch) {
  MetricsRecord r;
  r.name = "<img src=x onerror=alert(1)>";
  r.epoch = epoch;
  r.samples_per_second = 50;
  r.ttl_ms = 60'000;
  MetricsEntry e;
  e.peer = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
  e.value = encode_metrics(r).value();
  e.remaining_ttl = 59s;
  return e;
}

std::unique_ptr<Dashboard> start(DashboardConfig c = {}) {
  c.run_id = "test-run";
  c.port = 0;
  auto d = Dashboard::start(c);
  EXPECT_TRUE(d) << d.error().message();
  return d ? std::move(d).value() : nullptr;
}

}  // namespace

TEST(MonitorDashboard, ServesPageScriptChartJsonAndMetrics) {
  auto d = start();
  ASSERT_TRUE(d);
  ASSERT_GT(d->port(), 0);
  httplib::Client cli("127.0.0.1", d->port());
  cli.set_connection_timeout(5);
  cli.set_read_timeout(5);
  auto page = cli.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("<table id=\"contributors\">"), std::string::npos);
  EXPECT_NE(page->get_header_value("Content-Security-Policy").find("script-src 'self'"),
            std::string::npos);
  auto js = cli.Get("/dashboard.js");
  ASSERT_TRUE(js);
  EXPECT_EQ(js->status, 200);
  EXPECT_EQ(js->body.find("innerHTML"), std::string::npos);  // peer text goes in as text
  auto chart = cli.Get("/chart.js");
  ASSERT_TRUE(chart);
  if (chart->status == 200) {
    EXPECT_GT(chart->body.size(), 10000u);
  }
  d->update({entry(7)});
  auto state = cli.Get("/api/state");
  ASSERT_TRUE(state);
  EXPECT_EQ(state->status, 200);
  EXPECT_NE(state->body.find("\"epoch\":7"), std::string::npos);
  EXPECT_NE(state->body.find("\"updates\":1"), std::string::npos);
  auto prom = cli.Get("/metrics");
  ASSERT_TRUE(prom);
  EXPECT_NE(prom->body.find("starling_run_epoch{run=\"test-run\"} 7"), std::string::npos);
  auto post = cli.Post("/api/state", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_NE(post->status, 200);  // read-only
  EXPECT_GE(d->stats().requests, 6u);
  d->stop();
  d->stop();  // idempotent
}

TEST(MonitorDashboard, EventStreamDeliversUpdates) {
  auto d = start();
  ASSERT_TRUE(d);
  const int port = d->port();
  std::string received;
  std::thread reader([&] {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(20);
    (void)cli.Get("/events", [&](const char* data, std::size_t n) {
      received.append(data, n);
      return received.find("\"epoch\":9") == std::string::npos;  // stop after the update
    });
  });
  // Updates until the reader saw one (the stream sends the newest document when it opens
  // and every update after that); bounded.
  const auto deadline = Clock::now() + 20s;
  while (reader.joinable() && d->stats().event_streams == 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  d->update({entry(9)});
  reader.join();
  EXPECT_NE(received.find("data: {"), std::string::npos);
  EXPECT_NE(received.find("\"epoch\":9"), std::string::npos);
}

TEST(MonitorDashboard, LimitsEventStreamsAndStopsThemPromptly) {
  DashboardConfig c;
  c.max_event_streams = 1;
  auto d = start(c);
  ASSERT_TRUE(d);
  const int port = d->port();
  std::atomic<bool> first_open{false};
  std::thread holder([&] {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(30);
    (void)cli.Get("/events", [&](const char*, std::size_t) {
      first_open = true;
      return true;
    });
  });
  const auto deadline = Clock::now() + 20s;
  while (!first_open && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(first_open);
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(5);
  auto refused = cli.Get("/events");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  const auto t0 = Clock::now();
  d->stop();  // ends the open stream
  holder.join();
  EXPECT_LT(Clock::now() - t0, 10s);
  EXPECT_EQ(d->stats().refused_streams, 1u);
}

TEST(MonitorDashboard, ABusyPortIsAClearError) {
  auto d = start();
  ASSERT_TRUE(d);
  DashboardConfig c;
  c.port = d->port();
  auto again = Dashboard::start(c);
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().message().find(std::to_string(d->port())), std::string::npos);
}

TEST(MonitorPrometheus, EndpointServesTheCallbacksText) {
  int scrapes = 0;
  auto e = PrometheusEndpoint::start("127.0.0.1", 0, [&] {
    PrometheusText t;
    t.add("starling_test_scrapes_total", "counter", "Scrapes.", ++scrapes,
          {{"run", "a \"quoted\"\nrun\\"}});
    t.add("starling_test_nan", "gauge", "Not a number.", std::nan(""));
    return t.str();
  });
  ASSERT_TRUE(e) << e.error().message();
  EXPECT_EQ(e.value()->url(), "http://127.0.0.1:" + std::to_string(e.value()->port()) + "/metrics");
  httplib::Client cli("127.0.0.1", e.value()->port());
  cli.set_read_timeout(5);
  auto r = cli.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body,
            "# HELP starling_test_scrapes_total Scrapes.\n"
            "# TYPE starling_test_scrapes_total counter\n"
            "starling_test_scrapes_total{run=\"a \\\"quoted\\\"\\nrun\\\\\"} 1\n"
            "# HELP starling_test_nan Not a number.\n"
            "# TYPE starling_test_nan gauge\n"
            "starling_test_nan NaN\n");
  EXPECT_EQ(cli.Get("/")->status, 404);
  e.value()->stop();
  e.value()->stop();
}
