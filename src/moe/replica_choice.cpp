// Replica choice by expected finish time (replica_choice.hpp).
#include "starling/moe/replica_choice.hpp"

#include <algorithm>
#include <optional>

namespace starling::moe {

namespace {

Duration from_seconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(std::max(0.0, s)));
}

}  // namespace

double ReplicaChooser::Model::seconds(std::size_t rows) const {
  const double var = xx - x * x;
  const double cov = xy - x * y;
  double slope = 0, intercept = y;
  if (var > 1e-9 * std::max(1.0, x * x)) {
    slope = cov / var;
    intercept = y - slope * x;
    if (slope < 0) {
      slope = 0;
      intercept = y;
    } else if (intercept < 0) {
      intercept = 0;
      slope = x > 0 ? y / x : 0;
    }
  }
  return intercept + slope * static_cast<double>(rows);
}

void ReplicaChooser::begin(TimePoint now) {
  now_ = now;
  queue_.clear();
  std::erase_if(failed_, [&](const auto& f) { return now - f.second >= options_.avoid_failed; });
  std::erase_if(failed_servers_,
                [&](const auto& f) { return now - f.second >= options_.avoid_failed; });
  std::erase_if(models_,
                [&](const auto& m) { return now - m.second.last >= options_.forget_after; });
}

Duration ReplicaChooser::unmeasured(std::size_t rows) const {
  std::optional<double> best;
  for (const auto& [_, m] : models_) {
    const double s = m.seconds(rows);
    if (!best || s < *best) best = s;
  }
  return best ? from_seconds(*best) : options_.unmeasured_cost;
}

Duration ReplicaChooser::expected(const std::string& server, std::size_t rows) const {
  auto it = models_.find(server);
  return it == models_.end() ? unmeasured(rows) : from_seconds(it->second.seconds(rows));
}

std::size_t ReplicaChooser::choose(const std::string& uid, const std::vector<std::string>& servers,
                                   std::size_t rows) {
  std::size_t best = 0;
  Duration best_finish{}, best_cost{};
  int best_avoided = 0;
  bool best_fresh = false;
  for (std::size_t i = 0; i < servers.size(); ++i) {
    // 2: failed for this expert; 1: failed for another; 0: no recent failure.
    const int avoided = failed_.count({uid, servers[i]})    ? 2
                        : failed_servers_.count(servers[i]) ? 1
                                                            : 0;
    const Duration cost = expected(servers[i], rows);
    auto q = queue_.find(servers[i]);
    const Duration finish = (q == queue_.end() ? Duration::zero() : q->second) + cost;
    const bool fresh = !measured(servers[i]);  // wins ties, so it gets tried
    if (i == 0 || avoided < best_avoided ||
        (avoided == best_avoided &&
         (finish < best_finish || (finish == best_finish && fresh && !best_fresh)))) {
      best = i;
      best_finish = finish;
      best_cost = cost;
      best_avoided = avoided;
      best_fresh = fresh;
    }
  }
  if (!servers.empty()) queue_[servers[best]] += best_cost;
  return best;
}

void ReplicaChooser::observe(const std::string& server, std::size_t rows, Duration elapsed,
                             TimePoint now) {
  const double x = static_cast<double>(rows);
  const double y = std::chrono::duration<double>(elapsed).count();
  auto [it, fresh] = models_.try_emplace(server);
  Model& m = it->second;
  const double a = fresh ? 1.0 : options_.alpha;
  m.x = (1 - a) * m.x + a * x;
  m.y = (1 - a) * m.y + a * y;
  m.xx = (1 - a) * m.xx + a * x * x;
  m.xy = (1 - a) * m.xy + a * x * y;
  m.last = now;
}

void ReplicaChooser::failed(const std::string& uid, const std::string& server, TimePoint now) {
  failed_[{uid, server}] = now;
  failed_servers_[server] = now;
}

}  // namespace starling::moe
