// RunAggregator (aggregator.hpp): contributors, totals and history from metrics records.
#include "starling/monitor/aggregator.hpp"

#include <algorithm>

#include "starling/core/log.hpp"

namespace starling::monitor {

namespace {
// How old a record read from the DHT is: its ttl minus the ttl it has left.
double record_age_s(const MetricsRecord& r, const MetricsEntry& e) {
  const double ttl_s = static_cast<double>(r.ttl_ms) / 1000.0;
  return std::max(0.0, ttl_s - std::chrono::duration<double>(e.remaining_ttl).count());
}
}  // namespace

std::optional<IdentityConflict> older_identity_conflict(const std::vector<MetricsEntry>& entries,
                                                        const net::PeerId& self,
                                                        const std::string& identity,
                                                        double own_uptime_s, double margin_s) {
  for (const auto& e : entries) {
    if (e.peer == self) continue;
    auto r = decode_metrics(e.value);
    if (!r || r.value().task.empty() || r.value().task == identity) continue;
    const double started_ago = r.value().uptime_s + record_age_s(r.value(), e);
    const double lead = started_ago - own_uptime_s;
    const bool older =
        lead > margin_s || (lead >= -margin_s && e.peer.to_string() < self.to_string());
    if (own_uptime_s <= 0 || older) return IdentityConflict{e.peer, std::move(r).value().task};
  }
  return std::nullopt;
}

RunAggregator::RunAggregator(TimePoint start, AggregatorConfig config)
    : start_(start), config_(config) {
  config_.max_points = std::max<std::size_t>(config_.max_points, 2);
}

double RunAggregator::seconds(TimePoint now) const {
  return std::chrono::duration<double>(now - start_).count();
}

void RunAggregator::update(TimePoint now, const std::vector<MetricsEntry>& entries) {
  const double t = seconds(now);
  std::map<std::string, Contributor> next;
  for (const auto& e : entries) {
    if (next.size() >= config_.max_contributors) {
      ++rejected_;
      continue;
    }
    auto rec = decode_metrics(e.value, config_.limits);
    if (!rec) {
      ++rejected_;
      logger("monitor")->debug("metrics of {}: {}", e.peer.to_string(), rec.error().message());
      continue;
    }
    const auto id = e.peer.to_string();
    Contributor c;
    c.record = std::move(rec).value();
    c.age_s = record_age_s(c.record, e);
    c.first_seen_s = c.last_seen_s = t;
    if (auto it = peers_.find(id); it != peers_.end()) {
      c.first_seen_s = it->second.first_seen_s;
      const auto& old = it->second.record;
      if (old.seq == c.record.seq && old.epoch == c.record.epoch)
        c.last_seen_s = it->second.last_seen_s;
    }
    next[id] = std::move(c);
  }
  peers_ = std::move(next);
  ++updates_;
  compute_totals();
  RunPoint p;
  p.t = t;
  p.epoch = totals_.epoch;
  p.peers = totals_.peers;
  p.samples_per_second = totals_.samples_per_second;
  p.loss = totals_.loss;
  if (totals_.eval) p.eval_accuracy = totals_.eval->accuracy;
  if (totals_.eval) p.eval_perplexity = totals_.eval->perplexity;
  p.bytes = totals_.bytes_sent + totals_.bytes_received;
  history_.push_back(p);
  while (history_.size() > config_.max_points) history_.pop_front();
}

void RunAggregator::compute_totals() {
  RunTotals t;
  t.peers = peers_.size();
  double loss_weighted = 0, loss_weight = 0, loss_sum = 0;
  std::size_t loss_n = 0;
  for (const auto& [id, c] : peers_) {
    const auto& r = c.record;
    t.epoch = std::max(t.epoch, r.epoch);
    t.samples_per_second += r.samples_per_second;
    t.samples_total += r.samples_total;
    t.bytes_sent += r.bytes_sent;
    t.bytes_received += r.bytes_received;
    t.target_batch_size = std::max(t.target_batch_size, r.target_batch_size);
    if (r.eval && (!t.eval || r.eval->epoch > t.eval->epoch)) t.eval = r.eval;
    if (r.loss) {
      loss_weighted += *r.loss * r.samples_per_second;
      loss_weight += r.samples_per_second;
      loss_sum += *r.loss;
      ++loss_n;
    }
  }
  for (const auto& [id, c] : peers_)
    if (c.record.epoch == t.epoch)
      t.samples_accumulated = std::max(t.samples_accumulated, c.record.samples_accumulated);
  if (loss_weight > 0)
    t.loss = loss_weighted / loss_weight;
  else if (loss_n > 0)
    t.loss = loss_sum / static_cast<double>(loss_n);
  if (t.target_batch_size > 0 && t.samples_per_second > 0) {
    const double left = t.target_batch_size > t.samples_accumulated
                            ? static_cast<double>(t.target_batch_size - t.samples_accumulated)
                            : 0.0;
    t.eta_s = left / t.samples_per_second;
  }
  totals_ = t;
}

}  // namespace starling::monitor
