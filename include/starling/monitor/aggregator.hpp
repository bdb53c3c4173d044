// RunAggregator: the run as a monitor sees it, from the metrics records it read in the DHT:
// the live contributors, the run's totals and a bounded history for charts. Pure: no I/O,
// time is a parameter.
//
// Threading rule: one thread at a time (the Dashboard guards it with its mutex).
#pragma once

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "starling/core/async.hpp"
#include "starling/monitor/metrics_record.hpp"

namespace starling::monitor {

// One sub-key as read from the DHT (its owner checked by metrics_owner and the DHT's
// signature validator).
struct MetricsEntry {
  net::PeerId peer;
  Bytes value;
  Duration remaining_ttl{0};
};

// Another peer of the run that trains something else (another task identity: task, data,
// vocabulary, model or optimizer) and started before this peer.
struct IdentityConflict {
  net::PeerId peer;
  std::string task;
};
// The first entry of another peer whose record carries a task identity other than `identity`
// and whose publisher has run longer than this peer: its uptime at publication plus the
// record's age (from its ttl and the remaining ttl) exceeds `own_uptime_s` by more than
// `margin_s`. Within the margin (two peers started about together, measured with a publication
// delay and a ttl's resolution) the smaller peer id counts as the older, a rule both sides
// evaluate alike: the younger of two mismatched peers is the one to leave, and exactly one
// leaves. Entries without a task identity, undecodable ones and this peer's own are skipped.
// With own_uptime_s <= 0 (at start) every mismatch counts.
std::optional<IdentityConflict> older_identity_conflict(const std::vector<MetricsEntry>& entries,
                                                        const net::PeerId& self,
                                                        const std::string& identity,
                                                        double own_uptime_s, double margin_s = 5);

struct Contributor {
  MetricsRecord record;
  double age_s = 0;         // how old the record was at the last poll
  double first_seen_s = 0;  // monitor time (seconds since the aggregator's start)
  double last_seen_s = 0;   // monitor time the record last changed (seq or epoch)
};

struct RunTotals {
  std::uint64_t epoch = 0;  // the highest epoch a contributor reports
  std::size_t peers = 0;
  double samples_per_second = 0;
  std::uint64_t samples_total = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t target_batch_size = 0;
  std::uint64_t samples_accumulated = 0;  // toward the next step (largest estimate)
  std::optional<double> loss;             // throughput-weighted mean of the contributors'
  std::optional<double> eta_s;            // to the next collaborative step
  // The newest held-out evaluation any contributor reports (highest eval epoch).
  std::optional<MetricsRecord::Eval> eval;
};

struct RunPoint {
  double t = 0;  // monitor time, seconds
  std::uint64_t epoch = 0;
  std::size_t peers = 0;
  double samples_per_second = 0;
  std::optional<double> loss;
  std::optional<double> eval_accuracy;    // RunTotals::eval at this point
  std::optional<double> eval_perplexity;  // its perplexity (language-model task)
  std::uint64_t bytes = 0;                // sent + received, all contributors
};

struct AggregatorConfig {
  std::size_t max_points = 720;  // history kept for charts
  std::size_t max_contributors = 4096;
  MetricsLimits limits;
};

class RunAggregator {
 public:
  RunAggregator(TimePoint start, AggregatorConfig config = {});

  // A complete read of the run's records at `now`: contributors missing from `entries` have
  // expired and are dropped; bad records are counted and skipped. Adds one history point.
  void update(TimePoint now, const std::vector<MetricsEntry>& entries);

  const std::map<std::string, Contributor>& contributors() const noexcept { return peers_; }
  const RunTotals& totals() const noexcept { return totals_; }
  const std::deque<RunPoint>& history() const noexcept { return history_; }
  std::uint64_t updates() const noexcept { return updates_; }
  std::uint64_t rejected() const noexcept { return rejected_; }
  double seconds(TimePoint now) const;

 private:
  void compute_totals();

  TimePoint start_;
  AggregatorConfig config_;
  std::map<std::string, Contributor> peers_;  // by peer id (base58)
  RunTotals totals_;
  std::deque<RunPoint> history_;
  std::uint64_t updates_ = 0, rejected_ = 0;
};

}  // namespace starling::monitor
