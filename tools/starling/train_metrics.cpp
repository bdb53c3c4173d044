// TrainerMetrics (train_metrics.hpp).
#include "train_metrics.hpp"

#include <algorithm>
#include <cmath>

#include "monitor_cli.hpp"

namespace starling::cli {
namespace {

double secs(Duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

TrainerMetrics::TrainerMetrics(const TrainOptions& o, TrainNetwork& net) : o_(o), net_(net) {}

TrainerMetrics::~TrainerMetrics() {
  stop();
}

result<std::unique_ptr<TrainerMetrics>> TrainerMetrics::start(const TrainOptions& o,
                                                              TrainNetwork& net) {
  std::unique_ptr<TrainerMetrics> m(new TrainerMetrics(o, net));
  if (const auto addr = metrics_http_address(o); !addr.empty()) {
    auto hp = parse_http_address(addr);
    if (!hp) return hp.error().with_context("--metrics");
    auto* raw = m.get();
    auto e = monitor::PrometheusEndpoint::start(hp.value().first, hp.value().second,
                                                [raw] { return raw->render(); });
    if (!e) return e.error().with_context("--metrics " + addr);
    m->endpoint_ = std::move(e).value();
  }
  return m;
}

void TrainerMetrics::stop() {
  if (endpoint_) endpoint_->stop();
}

std::string TrainerMetrics::endpoint_url() const {
  return endpoint_ ? endpoint_->url() : "";
}

void TrainerMetrics::loss(double value) {
  if (!std::isfinite(value)) return;
  loss_sum_ += value;
  ++loss_n_;
  std::lock_guard lock(mutex_);
  snap_.loss_ema = snap_.have_loss ? 0.95 * snap_.loss_ema + 0.05 * value : value;
  snap_.have_loss = true;
}

void TrainerMetrics::step(const optim::StepReport& r) {
  std::lock_guard lock(mutex_);
  ++snap_.steps;
  snap_.averaging_s += secs(r.averaging_time);
  snap_.matchmaking_s += secs(r.matchmaking_time);
  snap_.allreduce_s += secs(r.allreduce_time);
  if (r.round_error) ++snap_.round_errors;
}

void TrainerMetrics::evaluated(double accuracy, double loss, std::uint64_t epoch,
                               std::optional<double> perplexity) {
  if (!std::isfinite(accuracy) || !std::isfinite(loss)) return;
  eval_ =
      monitor::MetricsRecord::Eval{std::clamp(accuracy, 0.0, 1.0), std::max(0.0, loss), epoch, {}};
  if (perplexity && std::isfinite(*perplexity))
    eval_->perplexity = std::clamp(*perplexity, 0.0, monitor::MetricsLimits{}.max_perplexity);
}

void TrainerMetrics::status(const optim::OptimizerStatus& s) {
  const auto now = Clock::now();
  if (first_status_) {
    first_status_ = false;
    samples_at_start_ = s.samples_total;
  }
  {
    std::lock_guard lock(mutex_);
    snap_.status = s;
    snap_.uptime_s = secs(now - started_);
  }
  if (metrics_enabled(o_) && secs(now - window_start_) >= std::max(0.1, o_.metrics_interval))
    publish(s, now);
}

void TrainerMetrics::publish(const optim::OptimizerStatus& s, TimePoint now) {
  const double window = secs(now - window_start_);
  monitor::MetricsRecord r;
  r.name = monitor::sanitize_name(o_.name);
  r.version = monitor::software_version();
  r.task = task_;
  r.epoch = s.local_epoch;
  if (loss_n_ > 0) r.loss = loss_sum_ / static_cast<double>(loss_n_);
  r.samples_per_second = static_cast<double>(s.samples_total - samples_at_start_) / window;
  r.samples_total = s.samples_total;
  r.uptime_s = secs(now - started_);
  auto [tx, rx] = net_.traffic();
  r.bytes_sent = std::max(tx, s.bytes_sent);
  r.bytes_received = std::max(rx, s.bytes_received);
  r.reachability = o_.client ? monitor::Reachability::client : monitor::Reachability::reachable;
  r.rounds_ok = s.rounds_ok;
  r.rounds_failed = s.rounds_failed;
  r.state_downloads = s.state_downloads;
  {
    std::lock_guard lock(mutex_);
    r.averaging_s = snap_.averaging_s;
  }
  r.target_batch_size = s.collaboration.target;
  r.samples_accumulated = s.collaboration.samples_accumulated;
  r.window_s = window;
  r.eval = eval_;
  net_.publish_metrics(std::move(r));
  window_start_ = now;
  loss_sum_ = 0;
  loss_n_ = 0;
  samples_at_start_ = s.samples_total;
}

std::string TrainerMetrics::render() const {
  Snapshot s;
  {
    std::lock_guard lock(mutex_);
    s = snap_;
  }
  const auto& st = s.status;
  const monitor::PrometheusText::Labels run = {{"run", o_.run_id}};
  monitor::PrometheusText t;
  t.add("starling_trainer_epoch", "gauge", "Local collaboration epoch.",
        static_cast<double>(st.local_epoch), run);
  t.add("starling_trainer_samples_total", "counter", "Samples this trainer contributed.",
        static_cast<double>(st.samples_total), run);
  t.add("starling_trainer_samples_per_second", "gauge", "This trainer's recent throughput.",
        st.local_samples_per_second, run);
  t.add("starling_trainer_collaboration_samples_per_second", "gauge",
        "The collaboration's throughput as this trainer estimates it.",
        st.collaboration.samples_per_second, run);
  t.add("starling_trainer_peers", "gauge", "Live peers of the collaboration, this one included.",
        static_cast<double>(st.collaboration.num_peers), run);
  if (s.have_loss)
    t.add("starling_trainer_loss", "gauge", "Training loss (exponential moving average).",
          s.loss_ema, run);
  t.add("starling_trainer_steps_total", "counter", "Optimizer step() calls.",
        static_cast<double>(s.steps), run);
  t.add("starling_trainer_step_seconds_total", "counter",
        "Seconds the training loop spent inside step().", secs(st.step_time), run);
  t.add("starling_trainer_round_seconds_total", "counter",
        "Seconds spent in averaging rounds (matchmaking + all-reduce).", s.averaging_s, run);
  t.add("starling_trainer_matchmaking_seconds_total", "counter",
        "Seconds completed rounds spent forming their group.", s.matchmaking_s, run);
  t.add("starling_trainer_allreduce_seconds_total", "counter",
        "Seconds completed rounds spent in the all-reduce.", s.allreduce_s, run);
  t.add("starling_trainer_rounds_total", "counter", "Averaging rounds completed.",
        static_cast<double>(st.rounds_ok), run);
  t.add("starling_trainer_round_failures_total", "counter", "Averaging rounds that failed.",
        static_cast<double>(st.rounds_failed), run);
  t.add("starling_trainer_state_downloads_total", "counter", "States downloaded from peers.",
        static_cast<double>(st.state_downloads), run);
  t.add("starling_trainer_bytes_sent_total", "counter", "Bytes sent by averaging rounds.",
        static_cast<double>(st.bytes_sent), run);
  t.add("starling_trainer_bytes_received_total", "counter", "Bytes received by averaging rounds.",
        static_cast<double>(st.bytes_received), run);
  t.add("starling_trainer_uptime_seconds", "gauge", "Seconds since the trainer started.",
        s.uptime_s, run);
  return t.str();
}

}  // namespace starling::cli
