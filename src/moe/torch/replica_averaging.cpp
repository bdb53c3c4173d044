// Replica averaging (ExpertServerConfig::average_period): the replicas of an expert average
// its parameters with the averaging module's butterfly all-reduce, at the same wall-clock
// instants; the runtime thread snapshots and writes back the parameters (expert_server.hpp).
#include <set>

#include <asio/post.hpp>

#include "moe/torch/server_impl.hpp"
#include "starling/averaging/host_address_sink.hpp"
#include "starling/core/log.hpp"

namespace starling::moe {

namespace {

// One round's buffers: the parameters flattened at the snapshot, the group's mean, and the
// expert's step count at the snapshot. Shared with the averager's step (StepData::owner) and
// the runtime jobs, so a late one never writes into freed memory.
struct RoundBuffers {
  std::vector<float> input;
  std::vector<float> output;
  std::uint64_t steps = 0;
};

}  // namespace

result<std::shared_ptr<averaging::Averager>> make_params_averager(
    const std::shared_ptr<net::Host>& host, const std::shared_ptr<averaging::Directory>& dir,
    Backend& b) {
  averaging::Schema schema;
  for (const auto& p : b.module.parameters->named_parameters()) {
    const auto& t = p.value();
    if (t.scalar_type() != torch::kFloat32)
      return Error(errc::invalid_argument,
                   "expert " + b.schema.uid + ": parameter " + p.key() + " is not float32");
    schema.tensors.push_back(
        {p.key(), std::vector<std::int64_t>(t.sizes().begin(), t.sizes().end())});
  }
  averaging::AveragerConfig c;
  c.key = {"moe-avg." + b.schema.uid, 16, 0};
  for (const auto& a : host->announce_addresses()) c.addrs.push_back(a.to_string());
  if (c.addrs.size() > 16) c.addrs.resize(16);
  c.reduce_threads = 1;
  return averaging::Averager::create(host, dir, std::move(schema), {}, c,
                                     averaging::host_address_sink(host));
}

awaitable<bool> ExpertServer::Impl::on_runtime(std::function<void()> fn, Duration timeout) {
  auto ex = co_await asio::this_coro::executor;
  auto ran = std::make_shared<AsyncEvent>(ex);
  {
    std::lock_guard lk(mu);
    if (stopping) co_return false;
    runtime_jobs.push_back([fn = std::move(fn), ran, ex] {
      fn();
      asio::post(ex, [ran] { ran->set(); });
    });
  }
  cv.notify_one();
  auto r = co_await with_timeout(ran->wait(), timeout, "expert runtime job");
  co_return static_cast<bool>(r);
}

awaitable<void> ExpertServer::Impl::average_loop(std::weak_ptr<Impl> weak) {
  std::int64_t period = 1;
  if (auto self = weak.lock())
    period = std::max<std::int64_t>(
        1, std::chrono::duration_cast<Millis>(self->cfg.average_period).count());
  for (;;) {
    const auto now =
        std::chrono::duration_cast<Millis>(WallClock::now().time_since_epoch()).count();
    const auto k = now / period + 1;  // the next multiple of the period, the same everywhere
    if (!co_await sleep_for(Millis(k * period - now))) co_return;
    auto self = weak.lock();
    if (!self) co_return;
    for (auto& b : self->backends) {
      if (!b->params_avg) continue;
      Backend* bp = b.get();
      self->scope->spawn([self, bp, k]() -> awaitable<void> {
        co_await self->average_expert(bp, "params/" + std::to_string(k));
      });
    }
  }
}

awaitable<void> ExpertServer::Impl::average_expert(Backend* b, std::string round) {
  const auto t0 = Clock::now();
  // A round ends before the next one starts.
  const Duration timeout = std::min(cfg.average_timeout, cfg.average_period * 9 / 10);
  auto reps = co_await experts_dir->find_expert(b->schema.uid);
  if (!reps) {
    logger("moe")->debug("expert {}: replicas not found: {}", b->schema.uid,
                         reps.error().message());
    co_return;
  }
  std::set<net::PeerId> peers{host->local_peer()};
  for (const auto& d : reps.value()) peers.insert(d.peer);
  if (peers.size() < 2) co_return;  // no replica to average with

  auto buf = std::make_shared<RoundBuffers>();
  auto snapshot = [b, buf] {
    torch::NoGradGuard ng;
    for (const auto& p : b->module.parameters->parameters()) {
      auto c = p.detach().contiguous();
      buf->input.insert(buf->input.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    }
    buf->output.resize(buf->input.size());
    buf->steps = b->steps;
  };
  if (!co_await on_runtime(snapshot, timeout)) co_return;
  averaging::StepOptions so;
  so.round = round;
  so.timeout = std::max<Duration>(timeout - (Clock::now() - t0), 1ms);
  so.expected_group_size = peers.size();
  auto r = co_await b->params_avg->step(so, averaging::StepData{buf->input, buf->output, buf});
  if (!r) {
    ++stats->average_failures;
    // No group in time is what a replica without averaging (or a dead one) causes every
    // round: debug; anything else: info.
    const auto level = r.error() == errc::timeout ? spdlog::level::debug : spdlog::level::info;
    logger("moe")->log(level, "expert {}: averaging with {} replicas: {}", b->schema.uid,
                       peers.size() - 1, r.error().message());
    co_return;
  }
  // Write the mean back; an expert that stepped since the snapshot keeps its progress.
  auto apply = [b, buf] {
    torch::NoGradGuard ng;
    const bool moved = b->steps != buf->steps;
    std::size_t at = 0;
    for (const auto& p : b->module.parameters->parameters()) {
      const auto n = static_cast<std::size_t>(p.numel());
      auto mean = torch::from_blob(buf->output.data() + at, p.sizes(), torch::kFloat32);
      if (moved)
        p.detach().add_(mean -
                        torch::from_blob(buf->input.data() + at, p.sizes(), torch::kFloat32));
      else
        p.detach().copy_(mean);
      at += n;
    }
  };
  if (!co_await on_runtime(apply, timeout)) {
    ++stats->average_failures;
    co_return;
  }
  ++stats->replica_averages;
  logger("moe")->debug("expert {}: parameters averaged in a group of {}", b->schema.uid,
                       r.value().group.members.size());
}

}  // namespace starling::moe
