// ExpertServer: RPC handlers, the declaring task and replica state (expert_server.hpp); the
// runtime thread is in server_runtime.cpp.
#include <asio/post.hpp>
#include <random>

#include "moe/torch/server_impl.hpp"
#include "starling/core/log.hpp"
#include "starling/moe/expert_directory.hpp"
#include "starling/net/rpc.hpp"
#include "starling/training/checkpoint.hpp"

namespace starling::moe {

void complete(Task& t, result<TaskAnswer> r) {
  auto p = t.pending;
  auto shared = std::make_shared<result<TaskAnswer>>(std::move(r));
  asio::post(t.ex, [p, shared] {
    p->out = std::move(*shared);
    p->done.set();
  });
}

bool ExpertServer::Impl::injected_failure() {
  return std::uniform_real_distribution<double>(0, 1)(failure_rng) < cfg.inject_failure_rate;
}

awaitable<result<TaskAnswer>> ExpertServer::Impl::submit(bool backward, const net::RpcContext& ctx,
                                                         const std::string& uid, Task task) {
  auto it = by_uid.find(uid);
  if (it == by_uid.end()) {
    ++stats->bad_requests;
    co_return Error(errc::not_found, "unknown expert uid '" + uid.substr(0, 64) + "'");
  }
  Backend* b = it->second;
  if (cfg.inject_failure_rate > 0 && injected_failure()) {
    ++stats->injected_failures;
    co_return Error(errc::unavailable, "expert " + b->schema.uid + ": injected failure");
  }
  if (task.rows < 1) {
    ++stats->bad_requests;
    co_return Error(errc::invalid_argument, "expert " + b->schema.uid + ": request without rows");
  }
  const auto rows64 = task.rows;
  const std::size_t pool = backward ? b->backward_pool : b->forward_pool;
  auto ex = co_await asio::this_coro::executor;
  auto pending = std::make_shared<Pending>(ex);
  BatchScheduler::TaskId id = 0;
  {
    std::lock_guard lk(mu);
    if (stopping) co_return Error(errc::unavailable, "expert server is stopping");
    if (queued.size() >= cfg.max_queued_tasks) {
      ++stats->refused;
      co_return Error(errc::too_large, "expert server queue is full");
    }
    const std::size_t max_batch = sched.config(pool).max_batch;
    std::optional<BatchScheduler::TaskId> got;
    if (static_cast<std::uint64_t>(rows64) <= max_batch)
      got = sched.push(pool, static_cast<std::size_t>(rows64), Clock::now());
    if (!got) {
      ++stats->bad_requests;
      co_return Error(errc::invalid_argument,
                      "expert " + b->schema.uid + ": " + std::to_string(rows64) +
                          " rows exceed max_batch " + std::to_string(max_batch));
    }
    id = *got;
    task.ex = ex;
    task.pending = pending;
    queued.emplace(id, std::move(task));
  }
  cv.notify_one();
  auto waited = co_await with_timeout(pending->done.wait(), ctx.remaining(), "expert task");
  if (!waited || !pending->out) {
    std::lock_guard lk(mu);
    if (sched.remove(id)) {
      queued.erase(id);
      ++stats->expired;
    }
    if (!waited) co_return waited.error();
    co_return Error(errc::internal, "expert task ended without an answer");
  }
  co_return std::move(*pending->out);
}

void ExpertServer::Impl::register_methods(std::weak_ptr<Impl> weak) {
  net::RpcServerOptions ro;
  ro.max_message_size = cfg.max_message_size;
  rpc = std::make_unique<net::RpcServer>(*host, ro);
  rpc->add_unary<pb::ExpertInfoRequest, pb::ExpertInfo>(
      kInfoProtocol,
      [weak](const net::RpcContext&,
             pb::ExpertInfoRequest req) -> awaitable<result<pb::ExpertInfo>> {
        auto self = weak.lock();
        if (!self) co_return Error(errc::unavailable, "expert server stopped");
        auto it = self->by_uid.find(req.uid());
        if (it == self->by_uid.end())
          co_return Error(errc::not_found, "unknown expert uid '" + req.uid().substr(0, 64) + "'");
        pb::ExpertInfo info;
        to_proto(it->second->schema, info);
        co_return info;
      });
  for (bool backward : {false, true}) {
    rpc->add_unary<pb::ExpertRequest, pb::ExpertResponse>(
        backward ? kBackwardProtocol : kForwardProtocol,
        [weak, backward](const net::RpcContext& ctx,
                         pb::ExpertRequest req) -> awaitable<result<pb::ExpertResponse>> {
          auto self = weak.lock();
          if (!self) co_return Error(errc::unavailable, "expert server stopped");
          Task t;
          if (req.tensors_size() >= 1 && req.tensors(0).shape_size() >= 1 &&
              req.tensors(0).shape(0) >= 1)
            t.rows = static_cast<std::size_t>(
                std::min<std::int64_t>(req.tensors(0).shape(0), std::int64_t{1} << 40));
          const std::string uid = req.uid();
          t.request = std::move(req);
          auto r = co_await self->submit(backward, ctx, uid, std::move(t));
          if (!r && r.error() != errc::timeout && r.error() != errc::cancelled)
            logger("moe")->debug("request from {}: {}", ctx.remote().short_string(),
                                 r.error().message());
          if (!r) co_return r.error();
          auto* msg = std::get_if<pb::ExpertResponse>(&r.value());
          if (!msg) co_return Error(errc::internal, "streamed answer to a one-message request");
          co_return std::move(*msg);
        });
  }
  register_stream_methods(weak);
}

awaitable<void> ExpertServer::Impl::download_states() {
  for (auto& b : backends) {
    if (b->steps > 0 || !b->state) continue;
    averaging::LoadStateOptions o;
    o.timeout = cfg.state_download_timeout;
    o.stall_timeout = std::min<Duration>(o.timeout, 10s);
    auto got = co_await b->state->load_blob(o);
    if (!got) {
      if (got.error() != errc::not_found) {
        ++stats->state_failures;
        logger("moe")->warn("expert {}: no state from replicas: {}", b->schema.uid,
                            got.error().message());
      }
      continue;
    }
    auto loaded = load_expert_state(got.value().data, got.value().info.epoch, *b);
    if (!loaded) {
      ++stats->state_failures;
      logger("moe")->warn("{}", loaded.error().message());
      continue;
    }
    ++stats->states_downloaded;
    logger("moe")->info("expert {}: state downloaded from replicas (step {})", b->schema.uid,
                        b->steps);
  }
}

awaitable<void> ExpertServer::Impl::share_snapshots() {
  if (!cfg.share_state) co_return;
  for (auto& b : backends) {
    if (!b->state) continue;
    std::shared_ptr<const Bytes> snap;
    std::uint64_t epoch = 0;
    bool fresh = false;
    {
      std::lock_guard lk(mu);
      snap = b->snapshot;
      epoch = b->snapshot_epoch;
      fresh = b->snapshot_new;
      b->snapshot_new = false;
    }
    if (!snap) continue;
    result<void> r = success();
    if (fresh) {
      averaging::BlobSnapshot blob;
      blob.epoch = epoch;
      blob.data = *snap;
      r = co_await b->state->share_blob(std::move(blob), cfg.declare_ttl);
      if (r) ++stats->states_shared;
    } else {
      r = co_await b->state->announce_blob(epoch, cfg.declare_ttl);
    }
    if (!r) {
      ++stats->state_failures;
      logger("moe")->info("expert {}: sharing state: {}", b->schema.uid, r.error().message());
    }
  }
}

Declaration ExpertServer::Impl::self_declaration() const {
  Declaration d;
  d.peer = host->local_peer();
  d.addrs = host->announce_addresses();
  if (d.addrs.size() > 16) d.addrs.resize(16);
  return d;
}

std::shared_ptr<ExpertServer> ExpertServer::create(std::shared_ptr<net::Host> host,
                                                   std::shared_ptr<averaging::Directory> directory,
                                                   ExpertServerConfig config) {
  std::shared_ptr<ExpertServer> s(new ExpertServer());
  s->impl_ = std::make_shared<Impl>();
  s->stats_ = std::make_shared<ExpertServerStats>();
  s->impl_->host = std::move(host);
  s->impl_->directory = directory;
  s->impl_->cfg = config;
  s->impl_->stats = s->stats_;
  if (!config.checkpoint_dir.empty())
    (void)training::remove_stale_temporaries(config.checkpoint_dir);
  if (directory)
    s->impl_->experts_dir =
        std::make_unique<ExpertDirectory>(std::move(directory), config.declare_period);
  return s;
}

ExpertServer::~ExpertServer() {
  auto& im = *impl_;
  {
    std::lock_guard lk(im.mu);
    im.stopping = true;
  }
  im.cv.notify_all();
  if (im.runtime.joinable()) {
    if (im.runtime.get_id() == std::this_thread::get_id())
      im.runtime.detach();
    else
      im.runtime.join();
  }
}

result<void> ExpertServer::add_expert(const std::string& uid, ExpertModule module,
                                      const OptimizerFactory& opt) {
  auto& im = *impl_;
  if (im.started) return Error(errc::invalid_argument, "add_expert after start()");
  ST_TRY(auto parsed, parse_uid(uid));
  const std::string canonical = parsed.to_string();
  if (im.by_uid.count(canonical))
    return Error(errc::already_exists, "expert " + canonical + " twice");
  auto b = std::make_unique<Backend>();
  b->schema.uid = canonical;
  b->schema.input_shape = module.input_shape;
  b->schema.output_shape = module.output_shape;
  b->schema.codec = im.cfg.codec;
  b->schema.max_batch = static_cast<std::uint32_t>(
      std::min(im.cfg.forward_pool.max_batch, im.cfg.backward_pool.max_batch));
  b->schema.expert_type = module.type;
  b->optimizer = opt(module.parameters->parameters());
  b->module = std::move(module);
  if (!im.cfg.checkpoint_dir.empty()) {
    ST_TRY(auto loaded, load_expert_checkpoint(im.cfg.checkpoint_dir, *b));
    if (loaded) {
      ++stats_->checkpoints_loaded;
      logger("moe")->info("expert {} restored from its checkpoint at step {}", canonical, b->steps);
    }
  }
  b->forward_pool = im.sched.add_pool(im.cfg.forward_pool);
  b->backward_pool = im.sched.add_pool(im.cfg.backward_pool);
  im.pool_owner[b->forward_pool] = {b.get(), false};
  im.pool_owner[b->backward_pool] = {b.get(), true};
  im.by_uid[canonical] = b.get();
  im.uids.push_back(parsed);
  im.backends.push_back(std::move(b));
  return success();
}

awaitable<result<void>> ExpertServer::start() {
  auto& im = *impl_;
  if (im.started) co_return Error(errc::invalid_argument, "expert server started twice");
  im.started = true;
  im.scope = std::make_unique<TaskScope>(im.host->get_executor());
  std::weak_ptr<Impl> weak = impl_;
  im.register_methods(weak);
  if (im.directory && (im.cfg.share_state || im.cfg.download_state)) {
    for (auto& b : im.backends) {
      auto a = make_state_averager(im.host, im.directory, b->schema.uid);
      if (!a) co_return a.error().with_context("expert " + b->schema.uid + " state averager");
      b->state = a.value();
      b->state->start();
    }
    if (im.cfg.download_state) co_await im.download_states();
    if (im.cfg.share_state) im.take_snapshots();
  }
  if (im.directory && im.cfg.average_period > Duration::zero()) {
    for (auto& b : im.backends) {
      auto a = make_params_averager(im.host, im.directory, *b);
      if (!a) co_return a.error().with_context("expert " + b->schema.uid + " replica averager");
      b->params_avg = a.value();
      b->params_avg->start();
    }
  }
  auto implp = impl_;
  im.runtime = std::thread([implp] { implp->runtime_loop(); });
  if (im.experts_dir) {
    auto first = co_await declare_now();
    if (!first) logger("moe")->warn("first declaration failed: {}", first.error().message());
    co_await im.share_snapshots();
    if (im.cfg.average_period > Duration::zero()) {
      im.scope->spawn(Impl::average_loop(impl_));
    }
    auto self = shared_from_this();
    std::weak_ptr<ExpertServer> ws = self;
    const Duration period = im.cfg.declare_period;
    im.scope->spawn([ws, period]() -> awaitable<void> {
      for (;;) {
        auto slept = co_await sleep_for(period);
        if (!slept) co_return;
        auto s = ws.lock();
        if (!s) co_return;
        auto r = co_await s->declare_now();
        if (!r) logger("moe")->warn("declaration failed: {}", r.error().message());
        co_await s->impl_->share_snapshots();
      }
    });
  }
  co_return success();
}

awaitable<result<void>> ExpertServer::declare_now() {
  auto& im = *impl_;
  if (!im.experts_dir) co_return success();
  auto r = co_await im.experts_dir->declare(im.uids, im.self_declaration(), im.cfg.declare_ttl);
  if (r)
    ++stats_->declarations;
  else
    ++stats_->declare_failures;
  co_return r;
}

awaitable<void> ExpertServer::stop() {
  auto& im = *impl_;
  im.rpc.reset();
  std::vector<Task> dropped;
  {
    std::lock_guard lk(im.mu);
    im.stopping = true;
    im.final_save = true;
    im.stop_deadline = Clock::now() + im.cfg.stop_timeout;
    for (auto& [id, t] : im.queued) {
      im.sched.remove(id);
      dropped.push_back(std::move(t));
    }
    im.queued.clear();
  }
  im.cv.notify_all();
  for (auto& t : dropped) complete(t, Error(errc::unavailable, "expert server is stopping"));
  if (im.scope) (void)co_await im.scope->close(im.cfg.stop_timeout);
  for (auto& b : im.backends) {
    if (b->state) co_await b->state->stop();
    if (b->params_avg) co_await b->params_avg->stop();
  }
  if (im.runtime.joinable()) {
    const auto until = Clock::now() + im.cfg.stop_timeout;
    while (!im.runtime_exited && Clock::now() < until) (void)co_await sleep_for(2ms);
    if (im.runtime_exited) {
      im.runtime.join();
    } else {
      logger("moe")->warn("expert runtime still busy after {} ms; detached",
                          std::chrono::duration_cast<Millis>(im.cfg.stop_timeout).count());
      im.runtime.detach();
    }
  }
}

std::vector<std::string> ExpertServer::uids() const {
  std::vector<std::string> out;
  for (const auto& u : impl_->uids) out.push_back(u.to_string());
  return out;
}

std::shared_ptr<torch::nn::Module> ExpertServer::module_of(const std::string& uid) const {
  auto it = impl_->by_uid.find(uid);
  return it == impl_->by_uid.end() ? nullptr : it->second->module.parameters;
}

torch::optim::Optimizer* ExpertServer::optimizer_of(const std::string& uid) const {
  auto it = impl_->by_uid.find(uid);
  return it == impl_->by_uid.end() ? nullptr : it->second->optimizer.get();
}

std::uint64_t ExpertServer::steps_of(const std::string& uid) const {
  auto it = impl_->by_uid.find(uid);
  return it == impl_->by_uid.end() ? 0 : it->second->steps;
}

}  // namespace starling::moe
