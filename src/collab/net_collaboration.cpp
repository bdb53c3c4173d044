// NetCollaboration (net_collaboration.hpp): progress records in the DHT, rounds and state
// transfer on two Averagers.
#include "starling/collab/net_collaboration.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "starling/averaging/dht_directory.hpp"
#include "starling/averaging/host_address_sink.hpp"
#include "starling/core/log.hpp"
#include "starling/dht/signing.hpp"

namespace starling::collab {
namespace {

auto log() {
  return logger("collab");
}

constexpr Duration kStateStopWait = 3s;

const char* codec_of(optim::Compression c) {
  switch (c) {
    case optim::Compression::float16:
      return "float16";
    case optim::Compression::uint8:
      return "blockwise8";
    case optim::Compression::none:
      break;
  }
  return "none";
}

// The provider adapter the state averager calls (a function object: GCC 12 and lambdas in
// coroutines).
// A state's digest travels as the blob snapshot's metadata: 8 bytes, big-endian.
Bytes digest_bytes(std::uint64_t d) {
  Bytes b(8);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(d >> (56 - 8 * i));
  return b;
}

std::uint64_t digest_of(const Bytes& metadata) {
  if (metadata.size() != 8) return 0;
  std::uint64_t d = 0;
  for (auto c : metadata) d = (d << 8) | c;
  return d;
}

struct ProviderSource {
  std::shared_ptr<std::function<awaitable<result<optim::Collaboration::State>>()>> provider;
  std::shared_ptr<std::atomic<std::uint64_t>> last_epoch;
  awaitable<result<averaging::BlobSnapshot>> operator()() const {
    ST_CO_TRY(auto st, co_await (*provider)());
    last_epoch->store(st.epoch);
    averaging::BlobSnapshot b;
    b.epoch = st.epoch;
    b.data = std::move(st.bytes);
    if (st.digest != 0) b.metadata = digest_bytes(st.digest);
    co_return b;
  }
};

}  // namespace

averaging::MatchmakingConfig NetCollaborationConfig::default_matchmaking() {
  averaging::MatchmakingConfig m;
  m.target_group_size = 64;  // everyone at the epoch in one group
  m.min_group_size = 2;
  // Peers decide to average from the same progress records, so they arrive within a moment
  // of each other; a peer that misses the group downloads the state instead.
  m.settle = 300ms;
  m.min_wait = 800ms;
  m.refresh_interval = 300ms;
  return m;
}

struct NetCollaboration::Impl {
  explicit Impl(asio::any_io_executor ex) : scope(ex) {}
  std::shared_ptr<averaging::DhtDirectory> directory;
  std::shared_ptr<averaging::Averager> grads, state;
  // The gradient averager's layout (names, sizes, codec) and its own buffers.
  std::vector<std::pair<std::string, std::size_t>> layout;
  optim::Compression compression = optim::Compression::none;
  std::vector<std::vector<float>> buffers;
  std::shared_ptr<std::function<awaitable<result<State>>()>> provider;
  std::shared_ptr<std::atomic<std::uint64_t>> served_epoch =
      std::make_shared<std::atomic<std::uint64_t>>(0);
  std::atomic<std::uint64_t> sent{0}, received{0};
  TaskScope scope;
  bool announcing = false, stopped = false;
  dht::RecordKey progress_key;
};

result<std::shared_ptr<NetCollaboration>> NetCollaboration::create(
    std::shared_ptr<net::Host> host, std::shared_ptr<dht::DhtNode> node,
    NetCollaborationConfig cfg) {
  if (!host || !node) return make_error(errc::invalid_argument, "collaboration: no host or node");
  if (cfg.run_id.size() > 48)
    return make_error(errc::invalid_argument, "collaboration: run id above 48 characters");
  if (auto k = averaging::GroupKey::initial({cfg.run_id + ".grads", 16, 0}, 1); !k)
    return k.error().with_context("collaboration: run id '" + cfg.run_id + "'");
  if (cfg.addrs.empty() && !cfg.client_mode)
    for (const auto& a : host->listen_addresses()) cfg.addrs.push_back(a.to_string());
  std::shared_ptr<NetCollaboration> c(new NetCollaboration(host, node, std::move(cfg)));
  c->impl_->directory = std::make_shared<averaging::DhtDirectory>(node);
  c->impl_->progress_key = dht::RecordKey(
      averaging::blake2b_256(as_bytes("starling/collab/progress/" + c->cfg_.run_id)));
  // The state averager averages nothing: it only serves and downloads blobs.
  averaging::AveragerConfig sc;
  sc.key = {c->cfg_.run_id + ".state", 16, 0};
  sc.addrs = c->cfg_.addrs;
  sc.client_mode = c->cfg_.client_mode;
  sc.open_timeout = c->cfg_.open_timeout;
  sc.reduce_threads = 1;
  auto sink = averaging::host_address_sink(host);
  ST_TRY(auto state,
         averaging::Averager::create(host, c->impl_->directory, averaging::Schema{}, {}, sc, sink));
  c->impl_->state = state;
  return c;
}

NetCollaboration::NetCollaboration(std::shared_ptr<net::Host> host,
                                   std::shared_ptr<dht::DhtNode> node, NetCollaborationConfig cfg)
    : host_(std::move(host)),
      node_(std::move(node)),
      cfg_(std::move(cfg)),
      impl_(std::make_unique<Impl>(host_->get_executor())) {}

NetCollaboration::~NetCollaboration() = default;

asio::any_io_executor NetCollaboration::executor() {
  return host_->get_executor();
}

const net::PeerId& NetCollaboration::self() const {
  return host_->local_peer();
}

awaitable<void> NetCollaboration::stop() {
  auto self = shared_from_this();
  if (impl_->stopped) co_return;
  impl_->stopped = true;
  impl_->provider.reset();
  impl_->state->set_blob_source(nullptr);
  (void)co_await impl_->scope.close(kStateStopWait);
  co_await impl_->state->stop();
  if (impl_->grads) co_await impl_->grads->stop();
}

// --- progress -----------------------------------------------------------------------------

awaitable<result<void>> NetCollaboration::publish_progress(Bytes value, Duration ttl) {
  auto self = shared_from_this();
  if (impl_->stopped) co_return make_error(errc::closed, "collaboration stopped");
  const auto ms = std::chrono::duration_cast<dht::Millis>(ttl);
  auto stored = co_await node_->store_signed(impl_->progress_key, node_->owned_subkey("progress"),
                                             std::move(value), ms);
  if (!stored) co_return stored.error().with_context("publish progress");
  if (stored.value().replicas == 0)
    co_return make_error(errc::unavailable, "publish progress: no DHT node took the record");
  co_return success();
}

awaitable<result<std::vector<optim::ProgressEntry>>> NetCollaboration::fetch_progress() {
  auto self = shared_from_this();
  std::vector<optim::ProgressEntry> out;
  auto found = co_await node_->get(impl_->progress_key, true);
  if (!found) co_return found.error().with_context("fetch progress");
  if (!found.value()) co_return out;
  for (const auto& [sub, v] : found.value()->dictionary) {
    // The DHT verified the owner's signature of every owned sub-key it returns.
    auto owners = dht::owners_in(sub.raw());
    if (!owners || owners.value().size() != 1 || !v.is_signed) {
      log()->warn("progress: ignoring an unowned or unsigned sub-key");
      continue;
    }
    optim::ProgressEntry e;
    e.peer = owners.value().front();
    e.value = v.value;
    e.remaining_ttl = v.ttl;
    out.push_back(std::move(e));
  }
  co_return out;
}

// --- rounds -------------------------------------------------------------------------------

result<void> NetCollaboration::ensure_grads(std::span<optim::NamedSpan> tensors,
                                            optim::Compression c) {
  std::vector<std::pair<std::string, std::size_t>> layout;
  for (const auto& t : tensors) layout.emplace_back(t.name, t.data.size());
  if (impl_->grads && layout == impl_->layout && c == impl_->compression) return success();
  if (impl_->grads) {
    // Another layout or codec: a new averager (the old one's handlers go).
    auto old = impl_->grads;
    impl_->scope.spawn([old]() -> awaitable<void> { co_await old->stop(); });
    impl_->grads.reset();
  }
  averaging::Schema schema;
  schema.codec = codec_of(c);
  impl_->buffers.clear();
  std::vector<averaging::TensorView> views;
  for (const auto& [name, n] : layout) {
    schema.tensors.push_back({name, {static_cast<std::int64_t>(n)}, averaging::DType::f32});
    impl_->buffers.emplace_back(n);
  }
  for (std::size_t i = 0; i < layout.size(); ++i)
    views.push_back({layout[i].first, impl_->buffers[i]});
  averaging::AveragerConfig ac;
  ac.key = {cfg_.run_id + ".grads", 16, 0};
  ac.matchmaking = cfg_.matchmaking;
  ac.round.stall_timeout = cfg_.stall_timeout;
  ac.bandwidth = cfg_.bandwidth;
  ac.client_mode = cfg_.client_mode;
  ac.addrs = cfg_.addrs;
  ac.open_timeout = cfg_.open_timeout;
  ac.reduce_threads = cfg_.reduce_threads;
  ac.error_feedback = cfg_.error_feedback && c != optim::Compression::none;
  ac.on_phase = [me = host_->local_peer().short_string()](const std::string& ph) {
    log()->debug("{}: {}", me, ph);
  };
  auto sink = averaging::host_address_sink(host_);
  ST_TRY(auto avg, averaging::Averager::create(host_, impl_->directory, std::move(schema),
                                               std::move(views), ac, sink));
  avg->start();
  impl_->grads = avg;
  impl_->layout = std::move(layout);
  impl_->compression = c;
  return success();
}

awaitable<result<optim::RoundResult>> NetCollaboration::average(std::span<optim::NamedSpan> tensors,
                                                                optim::RoundOptions options) {
  auto self = shared_from_this();
  if (impl_->stopped) co_return make_error(errc::closed, "collaboration stopped");
  ST_CO_TRY(ensure_grads(tensors, options.compression));
  auto avg = impl_->grads;
  for (std::size_t i = 0; i < tensors.size(); ++i)
    std::copy(tensors[i].data.begin(), tensors[i].data.end(), impl_->buffers[i].begin());
  averaging::StepOptions so;
  so.weight = options.weight;
  so.round = options.key;
  so.timeout = std::max<Duration>(options.deadline - Clock::now(), 100ms);
  so.matchmaking_timeout = std::min<Duration>(so.timeout / 2, 30s);
  // A strict majority of the peers expected at this epoch: two disjoint groups can never both
  // succeed, so the parameters of successful peers never fork.
  so.min_group_size =
      std::max<std::size_t>(cfg_.matchmaking.min_group_size, options.expected_members / 2 + 1);
  auto r = co_await avg->step(so);
  if (!r) co_return r.error();
  const auto& res = r.value();
  log()->info("round {}: {} peers, matchmaking {:.2f} s, all-reduce {:.2f} s, {} bytes sent",
              options.key, res.group.members.size(),
              std::chrono::duration<double>(res.matchmaking_time).count(),
              std::chrono::duration<double>(res.allreduce_time).count(), res.bytes_sent);
  impl_->sent += res.bytes_sent;
  impl_->received += res.bytes_received;
  if (avg != impl_->grads || impl_->stopped)
    co_return make_error(errc::cancelled, "collaboration changed during the round");
  for (std::size_t i = 0; i < tensors.size(); ++i)
    std::copy(impl_->buffers[i].begin(), impl_->buffers[i].end(), tensors[i].data.begin());
  optim::RoundResult out;
  for (const auto& m : res.contributions) {
    auto id = net::PeerId::from_bytes(m.peer.bytes());
    if (!id) continue;
    out.members.push_back({std::move(id).value(), m.weight});
    out.total_weight += m.weight;
  }
  out.bytes_sent = res.bytes_sent;
  out.bytes_received = res.bytes_received;
  out.matchmaking_time = res.matchmaking_time;
  out.allreduce_time = res.allreduce_time;
  ++rounds_;
  co_return out;
}

// --- state ---------------------------------------------------------------------------------

awaitable<result<optim::Collaboration::State>> NetCollaboration::download_state(
    TimePoint deadline, std::uint64_t want_digest) {
  auto self = shared_from_this();
  if (impl_->stopped) co_return make_error(errc::closed, "collaboration stopped");
  averaging::LoadStateOptions o;
  if (want_digest != 0) o.prefer_metadata = digest_bytes(want_digest);
  o.timeout = std::max<Duration>(deadline - Clock::now(), 100ms);
  o.max_bytes = cfg_.max_state_bytes;
  o.stall_timeout = std::min<Duration>(o.timeout, 20s);
  ST_CO_TRY(auto blob, co_await impl_->state->load_blob(o));
  impl_->received += blob.info.bytes;
  ++downloads_;
  State st;
  st.epoch = blob.info.epoch;
  st.bytes = std::move(blob.data);
  st.digest = digest_of(blob.info.metadata);
  co_return st;
}

void NetCollaboration::serve_state(std::function<awaitable<result<State>>()> provider) {
  if (impl_->stopped) return;
  if (!provider) {
    impl_->provider.reset();
    impl_->state->set_blob_source(nullptr);
    return;
  }
  impl_->provider =
      std::make_shared<std::function<awaitable<result<State>>()>>(std::move(provider));
  impl_->state->set_blob_source(ProviderSource{impl_->provider, impl_->served_epoch});
  if (!impl_->announcing) {
    impl_->announcing = true;
    impl_->scope.spawn(announce_loop(weak_from_this()));
  }
}

awaitable<void> NetCollaboration::announce_loop(std::weak_ptr<NetCollaboration> weak) {
  // Holds the collaboration only while announcing; stop() cancels the sleep.
  for (;;) {
    Duration pause = 2s;
    {
      auto self = weak.lock();
      if (!self || !self->impl_->provider || self->impl_->stopped) {
        if (self) self->impl_->announcing = false;
        co_return;
      }
      auto state = self->impl_->state;
      const auto epoch = self->impl_->served_epoch->load();
      const auto ttl = self->cfg_.state_ttl;
      self.reset();
      auto r = co_await state->announce_blob(epoch, ttl);
      if (!r)
        log()->info("state announcement failed: {}", r.error().message());
      else
        pause = ttl / 3;
    }
    if (!co_await sleep_for(pause)) co_return;
  }
}

std::uint64_t NetCollaboration::bytes_sent() const {
  return impl_->sent.load() + impl_->state->state_bytes_served();
}

std::uint64_t NetCollaboration::bytes_received() const {
  return impl_->received.load();
}

}  // namespace starling::collab
