// NetCollaboration (net_collaboration.hpp): progress records in the DHT, state transfer on the
// state Averager, lifetime. Rounds: net_collaboration_rounds.cpp.
#include "net_collaboration_impl.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "starling/averaging/ban_gate.hpp"
#include "starling/averaging/host_address_sink.hpp"
#include "starling/core/log.hpp"
#include "starling/dht/signing.hpp"
#include "state_check.hpp"

namespace starling::collab {
namespace {

auto log() {
  return logger("collab");
}

constexpr Duration kStateStopWait = 3s;

using detail::digest_bytes;
using detail::digest_of;

// The provider adapter the state averager calls (a function object: GCC 12 and lambdas in
// coroutines).
struct ProviderSource {
  std::shared_ptr<std::function<awaitable<result<training::Collaboration::State>>()>> provider;
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

constexpr Duration kAcctGrace = 5s;

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

result<std::shared_ptr<NetCollaboration>> NetCollaboration::create(
    std::shared_ptr<net::Host> host, std::shared_ptr<dht::DhtNode> node,
    NetCollaborationConfig cfg) {
  if (!host || !node) return make_error(errc::invalid_argument, "collaboration: no host or node");
  if (cfg.run_id.size() > 48)
    return make_error(errc::invalid_argument, "collaboration: run id above 48 characters");
  if (auto k = averaging::GroupKey::initial({cfg.run_id + ".grads", 16, 0}, 1); !k)
    return k.error().with_context("collaboration: run id '" + cfg.run_id + "'");
  if (cfg.addrs.empty() && !cfg.client_mode)
    for (const auto& a : host->announce_addresses()) cfg.addrs.push_back(a.to_string());
  std::shared_ptr<auth::MembershipService> members;
  if (cfg.membership) {
    ST_TRY(members, auth::MembershipService::create(node, *cfg.membership));
  }
  std::shared_ptr<NetCollaboration> c(new NetCollaboration(host, node, std::move(cfg)));
  c->impl_->members = members;
  c->impl_->directory = std::make_shared<averaging::DhtDirectory>(node);
  c->impl_->progress_key = dht::RecordKey(
      averaging::blake2b_256(as_bytes("starling/collab/progress/" + c->cfg_.run_id)));
  if (c->cfg_.verify) {
    averaging::acct::CheckConfig check;
    averaging::acct::apply_aggregation(check, c->cfg_.aggregation);
    // A wrong_average verdict waits kAcctGrace for the owner's false_report answer (members
    // of the round raise one only when the owner did not answer within the round; peers that
    // read it from the directory must also read the answer); meanwhile the suspect is left
    // out of matchmaking.
    c->impl_->bans = std::make_shared<averaging::acct::BanList>(check, kAcctGrace);
  }
  // The state averager averages nothing: it only serves and downloads blobs.
  averaging::AveragerConfig sc;
  sc.key = {c->cfg_.run_id + ".state", 16, 0};
  sc.addrs = c->cfg_.addrs;
  sc.client_mode = c->cfg_.client_mode;
  sc.client_now = c->cfg_.client_now;
  sc.open_timeout = c->cfg_.open_timeout;
  sc.reduce_threads = 1;
  // Banned peers get no state and serve none (members only, in a private run).
  sc.gate = averaging::ban_gate(c->impl_->bans, members);
  auto sink = averaging::host_address_sink(host);
  ST_TRY(auto state,
         averaging::Averager::create(host, c->impl_->directory, averaging::Schema{}, {}, sc, sink));
  c->impl_->state = state;
  if (members) members->start();
  {
    // Progress records count only from peers whose key a connection authenticated (or that
    // completed a round with this peer): fake identities have no host (progress_guard.hpp).
    c->impl_->guard.require_met();
    for (const auto& conn : host->connections()) c->impl_->guard.met(conn.peer);
    std::weak_ptr<NetCollaboration> weak = c;
    host->on_connection_opened([weak](const net::ConnectionInfo& info) {
      auto self = weak.lock();
      if (!self) return;
      asio::post(self->host_->get_executor(), [weak, peer = info.peer] {
        if (auto s = weak.lock()) s->impl_->guard.met(peer);
      });
    });
  }
  if (c->cfg_.verify) {
    // Connections of banned peers are closed as soon as they open (after the handshake has
    // proved the peer's identity).
    std::weak_ptr<NetCollaboration> weak = c;
    host->on_connection_opened([weak](const net::ConnectionInfo& info) {
      auto self = weak.lock();
      if (!self || !self->banned(info.peer)) return;
      log()->info("closing a connection of banned peer {}", info.peer.short_string());
      asio::post(self->host_->get_executor(), [weak, peer = info.peer] {
        if (auto s = weak.lock()) s->host_->disconnect(peer);
      });
    });
  }
  return c;
}

void NetCollaboration::convict(const net::PeerId& peer, std::string reason) {
  auto k = averaging::acct::key_of_peer(peer);
  if (!impl_->bans || !k) return;
  // The ban list lives on the executor; the optimizer calls from the training thread.
  asio::post(executor(), [bans = impl_->bans, key = *k, why = std::move(reason)]() mutable {
    bans->convict(key, std::move(why), Clock::now());
  });
}

bool NetCollaboration::banned(const net::PeerId& peer) const {
  if (!impl_->bans) return false;
  auto k = averaging::acct::key_of_peer(peer);
  return k && impl_->bans->banned(*k);
}

std::vector<NetCollaboration::BannedPeer> NetCollaboration::banned_peers() const {
  std::vector<BannedPeer> out;
  if (!impl_->bans) return out;
  for (const auto& b : impl_->bans->bans())
    out.push_back({averaging::acct::peer_of_key(b.peer), b.reason});
  return out;
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
  // A prepared round is dropped: its group (if formed) goes on without this peer.
  cancel_prepared_round();
  impl_->stopped = true;
  impl_->provider.reset();
  impl_->state->set_blob_source(nullptr);
  const TimePoint until = Clock::now() + kStateStopWait;
  (void)co_await impl_->scope.close(kStateStopWait);
  if (!co_await wait_cancelled(until))
    log()->info("stop: a cancelled early step is still matchmaking; left to its deadline");
  co_await impl_->state->stop();
  if (impl_->grads) co_await impl_->grads->stop();
  if (impl_->members) co_await impl_->members->stop();
}

std::shared_ptr<auth::MembershipService> NetCollaboration::membership() const {
  return impl_->members;
}

// --- progress -----------------------------------------------------------------------------

awaitable<result<void>> NetCollaboration::publish_progress(Bytes value, Duration ttl) {
  auto self = shared_from_this();
  if (impl_->stopped) co_return make_error(errc::closed, "collaboration stopped");
  const auto ms = std::chrono::duration_cast<dht::Millis>(ttl);
  if (cfg_.attack ==
      NetCollaborationConfig::Attack::flood) {  // test-only: fake records besides its own
    auto fakes = flood_records(*impl_, value, ms);
    auto r = co_await node_->store_records(impl_->progress_key, std::move(fakes));
    if (!r) log()->info("flood: fake progress records not stored: {}", r.error().message());
  }
  auto stored = co_await node_->store_signed(impl_->progress_key, node_->owned_subkey("progress"),
                                             std::move(value), ms);
  if (!stored) co_return stored.error().with_context("publish progress");
  if (stored.value().replicas == 0)
    co_return make_error(errc::unavailable, "publish progress: no DHT node took the record");
  co_return success();
}

awaitable<result<std::vector<training::ProgressEntry>>> NetCollaboration::fetch_progress() {
  auto self = shared_from_this();
  std::vector<training::ProgressEntry> out;
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
    if (banned(owners.value().front())) continue;  // its progress does not count
    training::ProgressEntry e;
    e.peer = owners.value().front();
    if (impl_->members) {  // a private run: members' records only
      const bool admitted = co_await impl_->members->admit(e.peer);
      if (!admitted) continue;
    }
    e.value = v.value;
    e.remaining_ttl = v.ttl;
    if (host_->is_connected(e.peer)) impl_->guard.met(e.peer);
    out.push_back(std::move(e));
  }
  co_return impl_->guard.filter(std::move(out), Clock::now());
}

// --- state ---------------------------------------------------------------------------------

awaitable<result<training::Collaboration::State>> NetCollaboration::download_state(
    TimePoint deadline, std::uint64_t want_digest) {
  auto self = shared_from_this();
  if (impl_->stopped) co_return make_error(errc::closed, "collaboration stopped");
  averaging::LoadStateOptions o;
  if (want_digest != 0) o.prefer_metadata = digest_bytes(want_digest);
  o.timeout = std::max<Duration>(deadline - Clock::now(), 100ms);
  o.max_bytes = cfg_.max_state_bytes;
  o.stall_timeout = std::min<Duration>(o.timeout, 20s);
  // Parameters other than the digest their donors announce are refused (state_check.hpp).
  o.verify = detail::StateCheck{};
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
