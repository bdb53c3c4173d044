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

constexpr Duration kHelloTimeout = 10s;

}  // namespace

result<std::shared_ptr<Averager>> Averager::create(std::shared_ptr<net::StreamHost> host,
                                                   std::shared_ptr<Directory> directory,
                                                   Schema schema, std::vector<TensorView> tensors,
                                                   AveragerConfig cfg, AddressSink add_addresses) {
  if (!host) return make_error(errc::invalid_argument, "averager: no host");
  ST_TRY(validate_schema(schema));
  ST_TRY(auto codecs, detail::TensorCodecs::from_schema(schema));
  if (!tensors.empty()) ST_TRY(check_views(schema, tensors));
  if (cfg.bandwidth == 0 || cfg.bandwidth > (std::uint64_t{1} << 40))
    return make_error(errc::invalid_argument, "averager: bandwidth out of range");
  if (!(cfg.upload_pace >= 0 && cfg.upload_pace <= 1e3) || cfg.upload_burst == 0)
    return make_error(errc::invalid_argument, "averager: upload pace or burst out of range");
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
  const auto& prefix = a->cfg_.key.prefix;
  a->impl_->join_protocol = averaging_protocol(kJoinProtocol, prefix);
  a->impl_->allreduce_protocol = averaging_protocol(kAllReduceProtocol, prefix);
  a->impl_->state_protocol = averaging_protocol(kStateProtocol, prefix);
  ST_TRY(a->setup_accountability());
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
  m.client = cfg_.client_mode || (cfg_.client_now && cfg_.client_now());
  m.weight = weight;
  return m;
}

// A member of the last group may ask to join this peer's next round a moment before this
// peer's step begins (the group predicts its leader, AveragerConfig::reuse_group): its request
// waits for our session, at most a refresh interval, instead of being refused.
awaitable<std::shared_ptr<detail::MatchSession>> Averager::await_match(const PeerKey& who) {
  auto self = shared_from_this();
  const auto& last = impl_->last_members;
  const bool member =
      std::any_of(last.begin(), last.end(), [&](const MemberInfo& m) { return m.peer == who; });
  if (!cfg_.reuse_group || !member) co_return nullptr;
  const TimePoint until = Clock::now() + cfg_.matchmaking.refresh_interval;
  while (!impl_->match && !impl_->stopped && Clock::now() < until)
    (void)co_await with_timeout(impl_->match_started.wait(), until - Clock::now(), "next round");
  co_return impl_->match;
}

void Averager::start() {
  if (impl_->started) return;
  impl_->started = true;
  std::weak_ptr<Averager> weak = weak_from_this();
  host_->set_stream_handler(
      impl_->join_protocol, [weak](net::ByteStreamPtr s, net::PeerId remote) -> awaitable<void> {
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
        if (auto gate = self->cfg_.gate) {  // a private run: members only
          self.reset();
          const bool admitted = co_await gate->admit(remote);
          self = weak.lock();
          if (!admitted || !self) {
            logger("averaging")
                ->info("join request from {}: not a member of this run", remote.short_string());
            auto r = net::length_prefixed(wire::encode_match(JoinReply{JoinVerdict::not_admitted}));
            (void)co_await s->write(r);
            (void)co_await s->close_write();
            co_return;
          }
        }
        auto session = self->impl_->match;
        if (!session) session = co_await self->await_match(PeerKey(remote.bytes()));
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
      impl_->allreduce_protocol,
      [weak](net::ByteStreamPtr s, net::PeerId remote) -> awaitable<void> {
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
  host_->set_stream_handler(impl_->state_protocol,
                            [weak](net::ByteStreamPtr s, net::PeerId remote) -> awaitable<void> {
                              auto self = weak.lock();
                              if (!self) co_return;
                              co_await self->serve_state(std::move(s), std::move(remote));
                            });
}

awaitable<void> Averager::stop() {
  impl_->stopped = true;
  host_->remove_stream_handler(impl_->join_protocol);
  host_->remove_stream_handler(impl_->allreduce_protocol);
  host_->remove_stream_handler(impl_->state_protocol);
  impl_->blob_source = nullptr;
  impl_->round_registered.set();
  // A step in flight ends now (its matchmaking is cancelled, its round abandoned: the others
  // go on without this member), and stop() returns once it is over, within stop_timeout.
  if (auto st = impl_->step.lock(); st && !st->outcome) PendingStep(st).end("averager: stopped");
  // The ended step's coroutine unwinds through its own cancel path; what has not finished by
  // stop_timeout is cancelled (TaskScope::close).
  if (!co_await impl_->steps.join(cfg_.stop_timeout))
    (void)co_await impl_->steps.close(cfg_.stop_timeout);
}

}  // namespace starling::averaging
