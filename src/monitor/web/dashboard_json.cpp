// The dashboard's JSON document and the Prometheus text exposition (aggregator.hpp).
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "starling/monitor/dashboard.hpp"
#include "starling/monitor/prometheus.hpp"

namespace starling::monitor {
namespace {

nlohmann::json optional_number(const std::optional<double>& v) {
  return v && std::isfinite(*v) ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

}  // namespace

std::string to_json(const RunAggregator& a, const std::string& run_id,
                    std::int64_t generated_unix_ms) {
  const auto& t = a.totals();
  nlohmann::json j;
  j["run_id"] = run_id;
  j["generated_unix_ms"] = generated_unix_ms;
  j["updates"] = a.updates();
  j["rejected"] = a.rejected();
  j["totals"] = {{"epoch", t.epoch},
                 {"peers", t.peers},
                 {"samples_per_second", t.samples_per_second},
                 {"samples_total", t.samples_total},
                 {"bytes_sent", t.bytes_sent},
                 {"bytes_received", t.bytes_received},
                 {"target_batch_size", t.target_batch_size},
                 {"samples_accumulated", t.samples_accumulated},
                 {"loss", optional_number(t.loss)},
                 {"eta_s", optional_number(t.eta_s)},
                 {"eval_accuracy", t.eval ? nlohmann::json(t.eval->accuracy) : nullptr},
                 {"eval_loss", t.eval ? nlohmann::json(t.eval->loss) : nullptr},
                 {"eval_epoch", t.eval ? nlohmann::json(t.eval->epoch) : nullptr},
                 {"eval_perplexity", t.eval ? optional_number(t.eval->perplexity) : nullptr}};
  auto& rows = j["contributors"] = nlohmann::json::array();
  for (const auto& [id, c] : a.contributors()) {
    const auto& r = c.record;
    rows.push_back({{"peer", id},
                    {"name", r.name},
                    {"version", r.version},
                    {"task", r.task},
                    {"epoch", r.epoch},
                    {"loss", optional_number(r.loss)},
                    {"samples_per_second", r.samples_per_second},
                    {"samples_total", r.samples_total},
                    {"uptime_s", r.uptime_s},
                    {"bytes_sent", r.bytes_sent},
                    {"bytes_received", r.bytes_received},
                    {"reachability", to_string(r.reachability)},
                    {"rounds_ok", r.rounds_ok},
                    {"rounds_failed", r.rounds_failed},
                    {"state_downloads", r.state_downloads},
                    {"averaging_s", r.averaging_s},
                    {"eval_accuracy", r.eval ? nlohmann::json(r.eval->accuracy) : nullptr},
                    {"age_s", c.age_s},
                    {"first_seen_s", c.first_seen_s},
                    {"last_seen_s", c.last_seen_s}});
  }
  auto& hist = j["history"] = nlohmann::json::array();
  for (const auto& p : a.history())
    hist.push_back({{"t", p.t},
                    {"epoch", p.epoch},
                    {"peers", p.peers},
                    {"samples_per_second", p.samples_per_second},
                    {"loss", optional_number(p.loss)},
                    {"eval_accuracy", optional_number(p.eval_accuracy)},
                    {"eval_perplexity", optional_number(p.eval_perplexity)},
                    {"bytes", p.bytes}});
  // Peer-supplied strings may hold any valid UTF-8; the dump escapes nothing unsafe for JSON
  // itself, and the page inserts every string as text.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string to_prometheus(const RunAggregator& a, const std::string& run_id) {
  const auto& t = a.totals();
  const auto run = prometheus_label(run_id);
  std::string out;
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} gauge\n{0}{{run=\"{2}\"}} {3}\n", name, help,
                       run, v);
  };
  gauge("starling_run_epoch", "Highest collaboration epoch a contributor reports.",
        static_cast<double>(t.epoch));
  gauge("starling_run_peers", "Contributors with a live metrics record.",
        static_cast<double>(t.peers));
  gauge("starling_run_samples_per_second", "Sum of the contributors' samples per second.",
        t.samples_per_second);
  gauge("starling_run_samples_total", "Samples contributed by the live contributors.",
        static_cast<double>(t.samples_total));
  gauge("starling_run_bytes_sent", "Bytes sent by the live contributors.",
        static_cast<double>(t.bytes_sent));
  gauge("starling_run_bytes_received", "Bytes received by the live contributors.",
        static_cast<double>(t.bytes_received));
  if (t.loss) gauge("starling_run_loss", "Throughput-weighted mean training loss.", *t.loss);
  if (t.eval)
    gauge("starling_run_eval_accuracy", "Newest held-out accuracy a contributor reports.",
          t.eval->accuracy);
  if (t.eval && t.eval->perplexity)
    gauge("starling_run_eval_perplexity",
          "Newest held-out perplexity a contributor reports (language-model task).",
          *t.eval->perplexity);
  gauge("starling_monitor_rejected_records", "Metrics records that failed validation.",
        static_cast<double>(a.rejected()));
  out += "# HELP starling_peer_samples_per_second A contributor's samples per second.\n";
  out += "# TYPE starling_peer_samples_per_second gauge\n";
  for (const auto& [id, c] : a.contributors())
    out += fmt::format("starling_peer_samples_per_second{{run=\"{}\",peer=\"{}\"}} {}\n", run,
                       prometheus_label(id), c.record.samples_per_second);
  out += "# HELP starling_peer_epoch A contributor's epoch.\n";
  out += "# TYPE starling_peer_epoch gauge\n";
  for (const auto& [id, c] : a.contributors())
    out += fmt::format("starling_peer_epoch{{run=\"{}\",peer=\"{}\"}} {}\n", run,
                       prometheus_label(id), c.record.epoch);
  return out;
}

}  // namespace starling::monitor
