// MembershipService: the run's members and revocations in the DHT (membership_service.hpp).
#include "starling/auth/membership_service.hpp"

#include <fstream>

#include <asio/post.hpp>

#include "starling/averaging/schema.hpp"
#include "starling/core/log.hpp"
#include "starling/dht/signing.hpp"

namespace starling::auth {
namespace {

auto log() {
  return logger("auth");
}

dht::RecordKey run_record_key(const char* what, const Key32& run_key) {
  return dht::RecordKey(averaging::blake2b_256(
      as_bytes(std::string("starling/run/") + what + "/" + to_hex(BytesView(run_key)))));
}

}  // namespace

result<MembershipConfig> membership_from_files(std::string_view run_key,
                                               const std::string& certificate,
                                               const std::string& revocations) {
  auto read = [](const std::string& path) -> result<Bytes> {
    std::ifstream f(path, std::ios::binary);
    if (!f) return make_error(errc::not_found, "cannot read " + path);
    Bytes b;
    char buf[4096];
    while (f.read(buf, sizeof buf) || f.gcount() > 0) {
      b.insert(b.end(), buf, buf + f.gcount());
      if (b.size() > (1u << 20)) return make_error(errc::too_large, path + ": above 1 MiB");
    }
    return b;
  };
  MembershipConfig m;
  ST_TRY(m.run_key, parse_run_key(run_key));
  ST_TRY(m.certificate, read(certificate));
  if (!revocations.empty()) {
    ST_TRY(m.revocations, read(revocations));
  }
  return m;
}

dht::RecordKey members_key(const Key32& run_key) {
  return run_record_key("members", run_key);
}

dht::RecordKey revocations_key(const Key32& run_key) {
  return run_record_key("revocations", run_key);
}

result<std::shared_ptr<MembershipService>> MembershipService::create(
    std::shared_ptr<dht::DhtNode> node, MembershipConfig cfg) {
  if (!node) return make_error(errc::invalid_argument, "membership: no DHT node");
  const net::PeerId self = node->peer();
  std::optional<RevocationList> list;
  if (!cfg.revocations.empty()) {
    ST_TRY(list, decode_revocations(cfg.revocations));
    if (list->run_key != cfg.run_key || !signature_valid(*list))
      return make_error(errc::permission, "revocation list not signed by the run key");
  }
  const auto t = unix_seconds(WallClock::now());
  if (!cfg.certificate.empty()) {  // else an observer
    ST_TRY(auto cert, decode_certificate(cfg.certificate));
    ST_TRY(auto me, member_key(self));
    if (auto r = verify_certificate(cert, cfg.run_key, me, t, list ? &*list : nullptr); !r)
      return r.error().with_context("this peer's membership certificate (" + self.to_string() +
                                    ")");
  }
  std::shared_ptr<MembershipService> s(new MembershipService(std::move(node), std::move(cfg)));
  if (!s->cfg_.certificate.empty()) {
    ST_TRY(s->members_->add_certificate(self, s->cfg_.certificate, t));
  }
  if (list) (void)s->members_->update_revocations(s->cfg_.revocations);
  return s;
}

MembershipService::MembershipService(std::shared_ptr<dht::DhtNode> node, MembershipConfig cfg)
    : node_(std::move(node)),
      cfg_(std::move(cfg)),
      members_(std::make_shared<Membership>(cfg_.run_key)),
      members_key_(members_key(cfg_.run_key)),
      revocations_key_(revocations_key(cfg_.run_key)),
      scope_(node_->executor()),
      refreshed_(node_->executor()) {}

MembershipService::~MembershipService() = default;

std::uint64_t MembershipService::now() const {
  return unix_seconds(WallClock::now());
}

void MembershipService::start() {
  asio::post(node_->executor(), [self = shared_from_this()] {
    if (!self->stopped_) self->scope_.spawn(run(self));
  });
}

awaitable<void> MembershipService::stop() {
  auto self = shared_from_this();
  stopped_ = true;
  refreshed_.pulse();
  (void)co_await scope_.close(2s);
}

awaitable<result<void>> MembershipService::publish_own() {
  auto self = shared_from_this();
  if (cfg_.certificate.empty()) co_return success();  // an observer publishes nothing
  const auto ttl = std::chrono::duration_cast<dht::Millis>(cfg_.record_ttl);
  auto stored = co_await node_->store_signed(members_key_, node_->owned_subkey("member"),
                                             cfg_.certificate, ttl);
  if (!stored) co_return stored.error().with_context("membership certificate");
  if (auto list = members_->revocations()) {
    auto r = co_await node_->store_signed(revocations_key_, node_->owned_subkey("revocations"),
                                          std::move(*list), ttl);
    if (!r) co_return r.error().with_context("revocation list");
  }
  co_return success();
}

awaitable<result<void>> MembershipService::refresh() {
  auto self = shared_from_this();
  ++stats_.refreshes;
  ++refreshing_count_;
  struct Done {
    MembershipService* s;
    ~Done() {
      --s->refreshing_count_;
      s->refreshed_.pulse();
    }
  } done{this};
  auto lists = co_await node_->get(revocations_key_, true);
  if (lists && lists.value()) {
    for (const auto& [sub, v] : lists.value()->dictionary) {
      auto r = members_->update_revocations(v.value);
      if (!r)
        log()->debug("membership: ignoring a revocation list: {}", r.error().message());
      else if (r.value())
        log()->info("membership: revocation list {} installed", members_->revocation_sequence());
    }
    if (!cfg_.certificate.empty() && !told_revoked_ &&
        members_->status(node_->peer(), now()) == MemberStatus::revoked) {
      told_revoked_ = true;
      log()->warn("membership: this peer's certificate is revoked: the run's members refuse it");
    }
  }
  auto found = co_await node_->get(members_key_, true);
  if (!found) co_return found.error().with_context("membership: reading the members");
  if (!found.value()) co_return success();
  const auto t = now();
  for (const auto& [sub, v] : found.value()->dictionary) {
    auto owners = dht::owners_in(sub.raw());  // the DHT checked the owner's signature
    if (!owners || owners.value().size() != 1 || !v.is_signed) continue;
    auto r = members_->add_certificate(owners.value().front(), v.value, t);
    if (!r) log()->debug("membership: {}", r.error().message());
  }
  co_return success();
}

awaitable<void> MembershipService::refresh_task() {
  auto self = shared_from_this();
  auto r = co_await refresh();
  if (!r) log()->info("membership lookup: {}", r.error().message());
}

void MembershipService::start_lookup() {
  if (stopped_ || refreshing_count_ > 0 || Clock::now() - last_lookup_ < cfg_.lookup_interval)
    return;
  last_lookup_ = Clock::now();
  ++stats_.lookups;
  ++refreshing_count_;  // seen by admit() at once; refresh() counts itself too
  scope_.spawn([self = shared_from_this()]() -> awaitable<void> {
    --self->refreshing_count_;
    co_await self->refresh_task();
  });
}

bool MembershipService::admits(const net::PeerId& peer) {
  const auto st = members_->status(peer, now());
  if (st == MemberStatus::member) return true;
  if (st == MemberStatus::unknown) start_lookup();
  ++stats_.refused;
  return false;
}

awaitable<bool> MembershipService::admit(const net::PeerId& peer) {
  auto self = shared_from_this();
  auto st = members_->status(peer, now());
  if (st == MemberStatus::unknown) {
    start_lookup();
    if (refreshing_count_ > 0 && !stopped_)
      (void)co_await with_timeout(refreshed_.wait(), cfg_.lookup_timeout, "membership lookup");
    st = members_->status(peer, now());
  }
  if (st == MemberStatus::member) co_return true;
  ++stats_.refused;
  log()->debug("membership: {} refused ({})", peer.short_string(), status_name(st));
  co_return false;
}

awaitable<result<void>> MembershipService::publish_revocations(Bytes list) {
  auto self = shared_from_this();
  ST_CO_TRY(auto installed, members_->update_revocations(list));
  if (!installed && members_->revocations() != list)
    co_return make_error(errc::already_exists,
                         "a revocation list with a higher sequence is already known (" +
                             std::to_string(members_->revocation_sequence()) + ")");
  const auto ttl = std::chrono::duration_cast<dht::Millis>(cfg_.record_ttl);
  auto r = co_await node_->store_signed(revocations_key_, node_->owned_subkey("revocations"),
                                        std::move(list), ttl);
  if (!r) co_return r.error().with_context("publishing the revocation list");
  co_return success();
}

awaitable<void> MembershipService::run(std::weak_ptr<MembershipService> weak) {
  if (auto self = weak.lock()) {
    if (auto p = co_await self->publish_own(); !p)
      log()->warn("membership: publishing this peer's certificate: {}", p.error().message());
    if (auto r = co_await self->refresh(); !r)
      log()->info("membership: first read of the members: {}", r.error().message());
  }
  TimePoint published = Clock::now();
  for (;;) {
    Duration pause;
    {
      auto self = weak.lock();
      if (!self || self->stopped_) co_return;
      pause = self->cfg_.poll_interval;
    }
    if (!co_await sleep_for(pause)) co_return;
    auto self = weak.lock();
    if (!self || self->stopped_) co_return;
    if (auto r = co_await self->refresh(); !r)
      log()->info("membership poll: {}", r.error().message());
    if (Clock::now() - published >= self->cfg_.record_ttl / 3) {
      published = Clock::now();
      if (auto p = co_await self->publish_own(); !p)
        log()->info("membership republish: {}", p.error().message());
    }
  }
}

}  // namespace starling::auth
