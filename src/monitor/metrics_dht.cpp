// MetricsPublisher, read_metrics and poll_metrics (metrics_dht.hpp).
#include "starling/monitor/metrics_dht.hpp"

#include <asio/post.hpp>

#include "starling/core/log.hpp"

namespace starling::monitor {
namespace {

auto log() {
  return logger("monitor");
}

}  // namespace

std::shared_ptr<MetricsPublisher> MetricsPublisher::create(std::shared_ptr<dht::DhtNode> node,
                                                           PublisherConfig config) {
  std::shared_ptr<MetricsPublisher> p(new MetricsPublisher(std::move(node), std::move(config)));
  // The loop holds the publisher until stop() closes the scope.
  asio::post(p->node_->executor(), [p] { p->scope_.spawn(loop(p)); });
  return p;
}

MetricsPublisher::MetricsPublisher(std::shared_ptr<dht::DhtNode> node, PublisherConfig config)
    : node_(std::move(node)),
      config_(std::move(config)),
      scope_(node_->executor()),
      wake_(std::make_unique<AsyncEvent>(node_->executor())) {}

MetricsPublisher::~MetricsPublisher() = default;

void MetricsPublisher::submit(MetricsRecord record) {
  {
    std::lock_guard lock(mutex_);
    pending_ = std::move(record);
  }
  asio::post(node_->executor(), [w = weak_from_this()] {
    if (auto self = w.lock()) self->wake_->set();
  });
}

awaitable<void> MetricsPublisher::stop(Duration bound) {
  auto self = shared_from_this();
  auto closed = co_await scope_.close(bound);
  if (!closed) log()->warn("metrics publisher: {}", closed.error().message());
}

awaitable<void> MetricsPublisher::loop(std::shared_ptr<MetricsPublisher> self) {
  for (;;) {
    auto woke = co_await self->wake_->wait();
    if (!woke) co_return;  // stop()
    self->wake_->reset();
    std::optional<MetricsRecord> next;
    {
      std::lock_guard lock(self->mutex_);
      next.swap(self->pending_);
    }
    if (!next) continue;
    co_await self->publish(std::move(*next));
    auto slept = co_await sleep_for(self->config_.interval);
    if (!slept) co_return;
  }
}

awaitable<void> MetricsPublisher::publish(MetricsRecord record) {
  record.seq = seq_++;
  const auto ttl = std::chrono::duration_cast<dht::Millis>(config_.ttl);
  record.ttl_ms = static_cast<std::uint64_t>(ttl.count());
  auto bytes = encode_metrics(record, config_.limits);
  if (!bytes) {
    ++failed_;
    log()->warn("metrics record not published: {}", bytes.error().message());
    co_return;
  }
  auto key = metrics_key(config_.run_id);
  std::optional<dht::SubKey> subkey = metrics_subkey(node_->peer());
  Bytes value = std::move(bytes).value();
  auto stored =
      co_await node_->store_signed(std::move(key), std::move(subkey), std::move(value), ttl);
  if (!stored || stored.value().replicas == 0) {
    ++failed_;
    log()->info("metrics record not published: {}",
                stored ? "no DHT node took it" : stored.error().message());
    co_return;
  }
  ++published_;
}

awaitable<result<std::vector<MetricsEntry>>> read_metrics(std::shared_ptr<dht::DhtNode> node,
                                                          dht::RecordKey key) {
  std::vector<MetricsEntry> out;
  auto found = co_await node->get(std::move(key), true);
  if (!found) co_return found.error().with_context("reading metrics records");
  if (!found.value()) co_return out;
  for (const auto& [sub, v] : found.value()->dictionary) {
    // The DHT checked the owner's signature of every owned sub-key it returns.
    auto owner = metrics_owner(sub);
    if (!owner || !v.is_signed) continue;
    MetricsEntry e;
    e.peer = std::move(owner).value();
    e.value = v.value;
    e.remaining_ttl = v.ttl;
    out.push_back(std::move(e));
  }
  co_return out;
}

awaitable<void> poll_metrics(std::shared_ptr<dht::DhtNode> node, PollerConfig config,
                             std::function<void(std::vector<MetricsEntry>)> sink) {
  const auto key = metrics_key(config.run_id);
  for (;;) {
    auto read = co_await with_timeout(read_metrics(node, key), config.timeout, "metrics read");
    if (read) {
      sink(std::move(read).value());
    } else {
      if (read.error().code() == make_error_code(errc::cancelled)) co_return;
      log()->info("{}", read.error().message());
    }
    auto slept = co_await sleep_for(config.interval);
    if (!slept) co_return;
  }
}

}  // namespace starling::monitor
