// A trainer's metrics (torch-free): the record it publishes in the DHT every
// --metrics-interval (mean loss and throughput over the window, the run's counters at its
// end) and, with --metrics HOST:PORT, its Prometheus endpoint (step, round, matchmaking and
// all-reduce time, bytes, peers, rounds, failures).
//
// Threading rule: loss(), step() and status() are called by the training thread; the
// endpoint's scrapes read a snapshot under a mutex.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "starling/monitor/prometheus.hpp"
#include "train_options.hpp"

namespace starling::cli {

class TrainerMetrics {
 public:
  // Starts the Prometheus endpoint if asked (errors name the address).
  static result<std::unique_ptr<TrainerMetrics>> start(const TrainOptions& o, TrainNetwork& net);
  ~TrainerMetrics();

  void loss(double value);
  void step(const optim::StepReport& r);
  // A held-out evaluation at `epoch` (carried by every later record).
  void evaluated(double accuracy, double loss, std::uint64_t epoch,
                 std::optional<double> perplexity = std::nullopt);
  // The task identity every record carries (TrainTask::identity()).
  void set_task(std::string identity) { task_ = std::move(identity); }
  // After each step: refreshes the endpoint's snapshot; publishes the window's record when due.
  void status(const optim::OptimizerStatus& s);
  // http://HOST:PORT/metrics, or "" without an endpoint.
  std::string endpoint_url() const;
  void stop();

 private:
  struct Snapshot {
    optim::OptimizerStatus status;
    double uptime_s = 0;
    double loss_ema = 0;
    bool have_loss = false;
    double averaging_s = 0, matchmaking_s = 0, allreduce_s = 0;
    std::uint64_t steps = 0, round_errors = 0;
  };
  TrainerMetrics(const TrainOptions& o, TrainNetwork& net);
  std::string render() const;
  void publish(const optim::OptimizerStatus& s, TimePoint now);

  const TrainOptions& o_;
  TrainNetwork& net_;
  const TimePoint started_ = Clock::now();
  // The window (training thread).
  TimePoint window_start_ = started_;
  double loss_sum_ = 0;
  std::size_t loss_n_ = 0;
  std::uint64_t samples_at_start_ = 0;
  bool first_status_ = true;
  std::optional<monitor::MetricsRecord::Eval> eval_;
  std::string task_;
  // Scrapes read this.
  mutable std::mutex mutex_;
  Snapshot snap_;
  std::unique_ptr<monitor::PrometheusEndpoint> endpoint_;
};

}  // namespace starling::cli
