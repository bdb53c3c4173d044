// Averager: accountability (AccountabilityConfig, docs/security.md): the round's statements
// (round_acct.hpp), evidence into the ban list and to the directory as accusations, the
// accusations of the run read before each step, banned peers left out.
//
// Threading rule: the host's executor.
#include "averager_impl.hpp"
#include "starling/averaging/acct_records.hpp"
#include "starling/core/log.hpp"
#include "starling/net/host.hpp"

namespace starling::averaging {

namespace {

// The run prefix of every round's context (RoundInfo::context): "<run>/".
Bytes run_prefix(const std::string& run) {
  return to_bytes(run + "/");
}

}  // namespace

result<void> Averager::setup_accountability() {
  const auto& a = cfg_.accountability;
  if (!a.enabled) return success();
  if (schema_.codec != "none" || impl_->codecs.compressed())
    return make_error(errc::invalid_argument,
                      "averager: accountability needs uncompressed parts (schema codec none)");
  if (a.run.empty() || a.run.size() > 128)
    return make_error(errc::invalid_argument, "averager: accountability run name of 1..128 bytes");
  impl_->acct_key = a.key;
  if (!impl_->acct_key) {
    auto h = std::dynamic_pointer_cast<net::Host>(host_);
    if (!h) return make_error(errc::invalid_argument, "averager: accountability needs the key");
    impl_->acct_key = h->key();
  }
  const auto id = net::PeerId::from_public_key(impl_->acct_key->public_key());
  if (!acct::key_of_peer(id) || !(id == host_->local_peer()))
    return make_error(errc::invalid_argument,
                      "averager: accountability key is not the host's Ed25519 identity");
  acct::CheckConfig check = a.check;
  acct::apply_aggregation(check, cfg_.round.aggregation);
  impl_->bans = a.bans ? a.bans : std::make_shared<acct::BanList>(check, a.grace);
  impl_->bans->set_run_prefix(run_prefix(a.run));
  // Peers without accountability speak other protocols: they never share a round with us.
  for (auto* id : {&impl_->join_protocol, &impl_->allreduce_protocol}) *id += "/acct";
  return success();
}

std::shared_ptr<acct::BanList> Averager::bans() const {
  return impl_->bans;
}

namespace {

std::optional<acct::PubKey> key_of_peer_key(const PeerKey& peer) {
  auto id = net::PeerId::from_bytes(peer.bytes());
  if (!id) return std::nullopt;
  return acct::key_of_peer(id.value());
}

}  // namespace

bool Averager::banned(const PeerKey& peer) const {
  if (!impl_->bans) return false;
  auto k = key_of_peer_key(peer);
  return k && impl_->bans->banned(*k);
}

bool Averager::suspected(const PeerKey& peer) const {
  if (!impl_->bans) return false;
  auto k = key_of_peer_key(peer);
  return k && impl_->bans->suspected(*k);
}

std::shared_ptr<const detail::RoundAcctConfig> Averager::round_acct(
    const std::string& round) const {
  if (!impl_->bans) return nullptr;
  auto c = std::make_shared<detail::RoundAcctConfig>();
  c->key = *impl_->acct_key;
  c->context = to_bytes(cfg_.accountability.run + "/" + round + "/" + key_.to_string() + "/");
  c->check = cfg_.accountability.check;
  acct::apply_aggregation(c->check, cfg_.round.aggregation);
  std::weak_ptr<Averager> weak = std::const_pointer_cast<Averager>(shared_from_this());
  c->on_evidence = [weak](const acct::Evidence& e) {
    if (auto a = weak.lock()) a->on_evidence(e);
  };
  c->grad_check_targets = cfg_.accountability.grad_check_targets;
  c->on_report = [bans = impl_->bans](const acct::ProjectionReport& r) { bans->remember(r); };
  using A = AccountabilityConfig::Attack;
  switch (cfg_.accountability.attack) {
    case A::none:
      break;
    case A::wrong_average:
      c->attack = detail::RoundAttack::wrong_average;
      break;
    case A::different_parts:
      c->attack = detail::RoundAttack::different_parts;
      break;
    case A::false_report:
      c->attack = detail::RoundAttack::false_report;
      break;
    case A::directory_lie:
      c->attack = detail::RoundAttack::directory_lie;
      c->on_forged = [weak](const acct::Evidence& e) {
        if (auto a = weak.lock()) a->publish_forged(e);
      };
      break;
  }
  return c;
}

namespace {

// Publishes one accusation (a background task of the averager; the directory bounds it).
awaitable<void> publish(std::shared_ptr<Directory> dir, std::string run, acct::Accusation a,
                        WallTime expires) {
  auto r = co_await acct::publish_accusation(*dir, run, a, expires);
  if (!r)
    logger("averaging")->warn("accountability: accusation not published: {}", r.error().message());
}

void publish_evidence(Averager::Impl& impl, const std::shared_ptr<Directory>& dir,
                      const AccountabilityConfig& cfg, const acct::Evidence& e) {
  const auto expires =
      WallClock::now() + std::chrono::duration_cast<WallClock::duration>(cfg.record_ttl);
  impl.steps.spawn(publish(dir, cfg.run, acct::make_accusation(e, *impl.acct_key), expires));
}

// Pending verdicts this peer found: published once the grace turned them into a ban, dropped
// once the owner answered (so that peers outside the round never see an answered one).
void release_verdicts(Averager::Impl& impl, const std::shared_ptr<Directory>& dir,
                      const AccountabilityConfig& cfg) {
  auto& list = impl.unpublished;
  for (auto it = list.begin(); it != list.end();) {
    const auto& owner = it->receipts.at(0).key;
    if (impl.bans->banned(owner)) {
      publish_evidence(impl, dir, cfg, *it);
      it = list.erase(it);
    } else if (!impl.bans->suspected(owner)) {
      it = list.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace

void Averager::on_evidence(const acct::Evidence& e) {
  auto log = logger("averaging");
  if (!impl_->bans || impl_->stopped) return;
  auto v = impl_->bans->add_evidence(e, Clock::now());
  if (!v) {
    log->warn("accountability: own evidence does not verify ({}): not published",
              v.error().message());
    return;
  }
  log->warn("accountability: {} evidence against a member{}", acct::to_string(e.kind),
            v.value().pending ? " (pending its answer)" : ": banned");
  if (v.value().pending)
    impl_->unpublished.push_back(e);
  else if (e.kind != acct::EvidenceKind::false_report ||
           e.receipts.at(1).key == acct::key_of(*impl_->acct_key))
    // An owner's answer is published by the owner only (its receivers hold the same values).
    publish_evidence(*impl_, directory_, cfg_.accountability, e);
}

void Averager::publish_forged(const acct::Evidence& e) {
  if (!impl_->bans || impl_->stopped) return;
  logger("averaging")
      ->warn(
          "accountability: TEST ATTACK directory-lie: publishing a false "
          "wrong_average accusation");
  publish_evidence(*impl_, directory_, cfg_.accountability, e);
}

awaitable<void> Averager::poll_accusations() {
  auto self = shared_from_this();
  if (!impl_->bans || impl_->polling) co_return;
  impl_->polling = true;
  struct Done {
    Averager* a;
    ~Done() { a->impl_->polling = false; }
  } done{this};
  auto bans = impl_->bans;
  const std::string run = cfg_.accountability.run;
  auto gate = cfg_.gate;  // a private run: members' accusations only
  auto r = co_await with_timeout(
      acct::collect_accusations(*directory_, run, *bans, Clock::now(), gate.get()),
      cfg_.open_timeout, "accusations");
  bans->tick(Clock::now());
  release_verdicts(*impl_, directory_, cfg_.accountability);
  for (auto& e : bans->take_found()) {  // report_conflict: a member lied in the directory
    logger("averaging")
        ->warn("accountability: {} evidence from the directory: published",
               acct::to_string(e.kind));
    publish_evidence(*impl_, directory_, cfg_.accountability, e);
  }
  if (!r) {
    logger("averaging")->debug("accountability: accusations not read: {}", r.error().message());
    co_return;
  }
  if (r.value().verified > 0 || r.value().rejected > 0)
    logger("averaging")
        ->info("accountability: {} new accusation(s) verified, {} rejected; {} peer(s) banned",
               r.value().verified, r.value().rejected, bans->bans().size());
}

}  // namespace starling::averaging
