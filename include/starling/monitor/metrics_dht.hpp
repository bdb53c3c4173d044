// The metrics records in the DHT: MetricsPublisher (a trainer publishes its newest record every
// interval, signed, with a ttl) and read_metrics / poll_metrics (a monitor reads every live
// record of a run).
//
// Threading rule: MetricsPublisher::submit() may be called from any thread; everything else
// runs on the DHT node's executor. stop() is bounded.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "starling/core/async.hpp"
#include "starling/dht/node.hpp"
#include "starling/monitor/aggregator.hpp"

namespace starling::monitor {

struct PublisherConfig {
  std::string run_id;
  Duration interval = 10s;  // at most one publication per interval
  Duration ttl = 60s;       // a record outlives its publisher by at most this
  MetricsLimits limits;
};

class MetricsPublisher : public std::enable_shared_from_this<MetricsPublisher> {
 public:
  static std::shared_ptr<MetricsPublisher> create(std::shared_ptr<dht::DhtNode> node,
                                                  PublisherConfig config);
  ~MetricsPublisher();

  // Any thread: the newest record (its seq and ttl_ms are set on publication). Published
  // at once if nothing was published within the interval, else at the interval's end.
  void submit(MetricsRecord record);
  // On the node's executor: stops publishing (bounded by `bound`).
  awaitable<void> stop(Duration bound = 3s);

  std::uint64_t published() const noexcept { return published_.load(); }
  std::uint64_t failed() const noexcept { return failed_.load(); }

 private:
  MetricsPublisher(std::shared_ptr<dht::DhtNode> node, PublisherConfig config);
  static awaitable<void> loop(std::shared_ptr<MetricsPublisher> self);
  awaitable<void> publish(MetricsRecord record);

  std::shared_ptr<dht::DhtNode> node_;
  PublisherConfig config_;
  TaskScope scope_;
  std::mutex mutex_;
  std::optional<MetricsRecord> pending_;  // guarded by mutex_
  std::unique_ptr<AsyncEvent> wake_;      // executor
  std::uint64_t seq_ = 0;                 // executor
  std::atomic<std::uint64_t> published_{0}, failed_{0};
};

// Every live, signed metrics sub-key of the run (unsigned or foreign sub-keys are skipped).
awaitable<result<std::vector<MetricsEntry>>> read_metrics(std::shared_ptr<dht::DhtNode> node,
                                                          dht::RecordKey key);

struct PollerConfig {
  std::string run_id;
  Duration interval = 2s;  // between the end of one read and the next
  Duration timeout = 15s;  // per read
};
// Reads the run's records every interval and hands each complete read to `sink` (on the
// executor) until cancelled; a failed read is logged and retried at the next interval.
awaitable<void> poll_metrics(std::shared_ptr<dht::DhtNode> node, PollerConfig config,
                             std::function<void(std::vector<MetricsEntry>)> sink);

}  // namespace starling::monitor
