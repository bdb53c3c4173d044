#include "starling/averaging/averager.hpp"

#include <random>

#include "averager_impl.hpp"
#include "match_session.hpp"
#include "round_runner.hpp"
#include "starling/averaging/compression.hpp"
#include "starling/core/blocking.hpp"
#include "starling/core/log.hpp"
#include "starling/core/thread_pool.hpp"

namespace starling::averaging {
namespace {

// Copies between the caller's tensors and the flat vector on the pool (64 MB of memcpy would
// otherwise stall the I/O thread). Function objects: GCC 12 and lambdas in coroutines.
struct GatherTask {
  const std::vector<TensorView>* views;
  std::vector<float>* flat;
  void operator()() const { gather_flat(*views, 0, *flat); }
};
struct ScatterTask {
  const std::vector<TensorView>* views;
  const std::vector<float>* flat;
  void operator()() const { scatter_flat(*views, 0, *flat); }
};

}  // namespace

namespace {

constexpr Duration kHelloTimeout = 10s;

}  // namespace

result<std::shared_ptr<Averager>> Averager::create(std::shared_ptr<net::StreamHost> host,
                                                   std::shared_ptr<Directory> directory,
                                                   Schema schema, std::vector<TensorView> tensors,
                                                   AveragerConfig cfg, AddressSink add_addresses) {
  if (!host) return make_error(errc::invalid_argument, "averager: no host");
  ST_TRY(validate_schema(schema));
  ST_TRY(auto codecs, detail::TensorCodecs::from_schema(schema));
  ST_TRY(check_views(schema, tensors));
  if (cfg.bandwidth == 0 || cfg.bandwidth > (std::uint64_t{1} << 40))
    return make_error(errc::invalid_argument, "averager: bandwidth out of range");
  if (cfg.round.part_elems == 0 || cfg.round.part_elems > (std::size_t{64} << 20) / sizeof(float))
    return make_error(errc::invalid_argument, "averager: part size must be 1 element .. 64 MiB");
  if (cfg.seed == 0)
    cfg.seed = std::random_device{}() | (std::uint64_t{std::random_device{}()} << 32);
  auto key = GroupKey::initial(cfg.key, cfg.seed);
  if (!key) return key.error();
  std::shared_ptr<Averager> a(new Averager(std::move(host), std::move(directory), std::move(schema),
                                           std::move(tensors), std::move(cfg),
                                           std::move(add_addresses)));
  a->key_ = std::move(key).value();
  a->impl_->codecs = std::move(codecs);
  return a;
}

Averager::Averager(std::shared_ptr<net::StreamHost> host, std::shared_ptr<Directory> directory,
                   Schema schema, std::vector<TensorView> tensors, AveragerConfig cfg,
                   AddressSink sink)
    : host_(std::move(host)),
      directory_(std::move(directory)),
      schema_(std::move(schema)),
      schema_hash_(averaging::schema_hash(schema_)),
      tensors_(std::move(tensors)),
      cfg_(std::move(cfg)),
      add_addresses_(std::move(sink)),
      pool_(std::make_unique<ThreadPool>(std::max<std::size_t>(1, cfg_.reduce_threads))),
      impl_(std::make_unique<Impl>(host_->get_executor())) {}

Averager::~Averager() {
  if (pool_) pool_->shutdown();
}

result<StepResult> Averager::step_blocking(StepOptions opts) {
  auto self = shared_from_this();
  const Duration limit = opts.timeout + 30s;
  return block_on(
      host_->get_executor(), [self, opts]() { return self->step(opts); }, limit);
}

result<void> Averager::share_state_blocking(std::uint64_t epoch, Bytes metadata, Duration ttl) {
  auto self = shared_from_this();
  return block_on(
      host_->get_executor(),
      [self, epoch, metadata, ttl]() { return self->share_state(epoch, metadata, ttl); }, 120s);
}

result<StateInfo> Averager::load_state_blocking(LoadStateOptions opts) {
  auto self = shared_from_this();
  const Duration limit = opts.timeout + 30s;
  return block_on(
      host_->get_executor(), [self, opts]() { return self->load_state(opts); }, limit);
}

MemberInfo Averager::self_info(double weight) const {
  MemberInfo m;
  m.peer = PeerKey(host_->local_peer().bytes());
  m.addrs = cfg_.addrs;
  m.bandwidth = cfg_.bandwidth;
  m.client = cfg_.client_mode;
  m.weight = weight;
  return m;
}

void Averager::start() {
  if (impl_->started) return;
  impl_->started = true;
  std::weak_ptr<Averager> weak = weak_from_this();
  host_->set_stream_handler(
      kJoinProtocol, [weak](net::ByteStreamPtr s, net::PeerId remote) -> awaitable<void> {
        auto reader = std::make_shared<net::BufferedReader>(*s);
        auto first = co_await with_timeout(reader->read_length_prefixed(wire::kMaxFrame),
                                           kHelloTimeout, "join request");
        if (!first) {
          s->reset();
          co_return;
        }
        auto f = wire::decode_match(first.value());
        auto self = weak.lock();
        if (!f || !std::holds_alternative<JoinRequest>(f.value()) || !self) {
          if (!f)
            logger("averaging")
                ->warn("join stream from {}: {}", remote.short_string(), f.error().message());
          s->reset();
          co_return;
        }
        auto session = self->impl_->match;
        if (!session) {
          // Not looking for a group right now.
          auto r = net::length_prefixed(wire::encode_match(JoinReply{JoinVerdict::begun}));
          (void)co_await s->write(r);
          (void)co_await s->close_write();
          co_return;
        }
        self.reset();
        co_await session->serve_join(remote, s, reader, std::get<JoinRequest>(f.value()));
      });
  host_->set_stream_handler(
      kAllReduceProtocol, [weak](net::ByteStreamPtr s, net::PeerId remote) -> awaitable<void> {
        auto reader = std::make_shared<net::BufferedReader>(*s);
        auto first = co_await with_timeout(reader->read_length_prefixed(wire::kMaxFrame),
                                           kHelloTimeout, "all-reduce hello");
        if (!first) {
          s->reset();
          co_return;
        }
        auto f = wire::decode_round(first.value(), kMaxGroupSize);
        if (!f || !std::holds_alternative<wire::Hello>(f.value().msg)) {
          logger("averaging")->warn("all-reduce stream from {}: no hello", remote.short_string());
          s->reset();
          co_return;
        }
        const auto hello = std::get<wire::Hello>(f.value().msg);
        // The round may start here a moment after the sender's: wait for it (bounded).
        std::shared_ptr<detail::RoundRunner> runner;
        const TimePoint until = Clock::now() + kHelloTimeout;
        for (;;) {
          auto self = weak.lock();
          if (!self) break;
          if (auto it = self->impl_->rounds.find(hello.group_id); it != self->impl_->rounds.end()) {
            runner = it->second;
            break;
          }
          if (Clock::now() >= until || self->impl_->stopped) break;
          auto& ev = self->impl_->round_registered;
          self.reset();
          (void)co_await with_timeout(ev.wait(), 200ms, "round registration");
        }
        if (!runner || hello.from >= runner->group().members.size() ||
            runner->group().members[hello.from].peer != PeerKey(remote.bytes())) {
          logger("averaging")
              ->info("all-reduce stream from {}: unknown round or member", remote.short_string());
          s->reset();
          co_return;
        }
        co_await runner->serve_inbound(hello.from, s, reader);
      });
  host_->set_stream_handler(kStateProtocol,
                            [weak](net::ByteStreamPtr s, net::PeerId remote) -> awaitable<void> {
                              auto self = weak.lock();
                              if (!self) co_return;
                              co_await self->serve_state(std::move(s), std::move(remote));
                            });
}

awaitable<void> Averager::stop() {
  impl_->stopped = true;
  host_->remove_stream_handler(kJoinProtocol);
  host_->remove_stream_handler(kAllReduceProtocol);
  host_->remove_stream_handler(kStateProtocol);
  impl_->round_registered.set();
  co_return;
}

awaitable<result<StepResult>> Averager::step(StepOptions opts) {
  auto self = shared_from_this();
  if (!impl_->started) start();
  if (impl_->stepping) co_return make_error(errc::already_exists, "averager: a step is running");
  if (!std::isfinite(opts.weight) || opts.weight < 0)
    co_return make_error(errc::invalid_argument, "averager: weight must be finite and >= 0");
  impl_->stepping = true;
  struct Reset {
    Impl* i;
    ~Reset() { i->stepping = false; }
  } reset{impl_.get()};

  const TimePoint t0 = Clock::now();
  const TimePoint deadline = t0 + opts.timeout;
  const std::uint64_t n = schema_.numel();
  // Kept across steps: fresh 2 x 4n bytes every step cost more in page faults than the copies.
  std::vector<float>& local = impl_->local_buf;
  std::vector<float>& output = impl_->output_buf;
  local.resize(n);
  output.resize(n);
  {
    GatherTask gather{&tensors_, &local};
    ST_CO_TRY(co_await pool_->run(gather));
  }

  StepResult res;
  GroupInfo group;
  const bool matched = !opts.group;
  if (opts.group) {
    group = *opts.group;
  } else {
    const Duration mm =
        opts.matchmaking_timeout.value_or(std::min<Duration>(opts.timeout / 2, 30s));
    const auto wnow = WallClock::now();
    MatchmakingCore core(cfg_.matchmaking, self_info(opts.weight), schema_hash_, key_, wnow,
                         wnow + std::chrono::duration_cast<WallClock::duration>(mm),
                         cfg_.seed ^ static_cast<std::uint64_t>(t0.time_since_epoch().count()));
    auto session = std::make_shared<detail::MatchSession>(
        *host_, *directory_, std::move(core), add_addresses_, cfg_.open_timeout, cfg_.on_phase);
    impl_->match = session;
    auto g = co_await session->run();
    impl_->match.reset();
    if (!g) co_return g.error();
    group = std::move(g).value();
  }
  res.matchmaking_time = Clock::now() - t0;

  ST_CO_TRY(validate_members(group.members));
  if (group.schema_hash != schema_hash_)
    co_return make_error(errc::invalid_argument, "averager: the group has another schema");
  const auto me = group.index_of(PeerKey(host_->local_peer().bytes()));
  if (!me) co_return make_error(errc::invalid_argument, "averager: this peer is not in the group");
  std::vector<net::PeerId> peers;
  for (const auto& m : group.members) {
    auto id = net::PeerId::from_bytes(m.peer.bytes());
    if (!id) co_return make_error(errc::invalid_argument, "averager: bad peer id in the group");
    if (add_addresses_ && !m.addrs.empty() && m.peer != group.members[*me].peer)
      add_addresses_(id.value(), m.addrs);
    peers.push_back(std::move(id).value());
  }

  detail::RoundRunnerConfig rcfg;
  rcfg.round = cfg_.round;
  rcfg.keepalive_interval = cfg_.keepalive_interval;
  rcfg.open_timeout = cfg_.open_timeout;
  rcfg.on_phase = cfg_.on_phase;
  rcfg.codecs = &impl_->codecs;
  // Error feedback: this step starts from the residual of earlier steps and commits the new
  // one only if it succeeds (on failure nothing was applied, so nothing was lost).
  std::vector<float> residual_out, result_residual_out;
  if (cfg_.error_feedback && impl_->codecs.compressed()) {
    if (impl_->residual.size() != n) impl_->residual.assign(n, 0.0f);
    if (impl_->result_residual.size() != n) impl_->result_residual.assign(n, 0.0f);
    residual_out = impl_->residual;
    result_residual_out = impl_->result_residual;
    rcfg.residual = impl_->residual;
    rcfg.residual_out = residual_out;
    rcfg.result_residual = impl_->result_residual;
    rcfg.result_residual_out = result_residual_out;
  }
  const TimePoint t1 = Clock::now();
  auto runner = std::make_shared<detail::RoundRunner>(
      *host_, group, static_cast<std::uint32_t>(*me), peers, local, output, rcfg, deadline, *pool_);
  impl_->rounds[group.group_id] = runner;
  impl_->round_registered.pulse();
  auto r = co_await runner->run();
  impl_->rounds.erase(group.group_id);
  res.allreduce_time = Clock::now() - t1;
  res.bytes_sent = runner->bytes_sent();
  res.bytes_received = runner->bytes_received();
  res.codec_time = runner->codec_time();
  if (!r) co_return r.error();

  {
    ScatterTask scatter{&tensors_, &output};
    ST_CO_TRY(co_await pool_->run(scatter));
  }
  if (!residual_out.empty()) {
    impl_->residual.swap(residual_out);
    impl_->result_residual.swap(result_residual_out);
  }
  if (matched)
    key_ = key_.next(static_cast<std::uint32_t>(*me),
                     static_cast<std::uint32_t>(group.members.size()));
  res.my_index = static_cast<std::uint32_t>(*me);
  res.subrounds = runner->core().subround() + 1;
  const auto& counted = runner->core().counted_elements();
  for (std::size_t i = 0; i < group.members.size(); ++i)
    res.contributions.push_back(
        {group.members[i].peer, group.members[i].weight, group.members[i].client, counted[i]});
  res.group = std::move(group);
  res.total_time = Clock::now() - t0;
  co_return res;
}

}  // namespace starling::averaging
