// The DeDLOC progress core: record codec, collaboration estimate, step scheduling.
#include "starling/training/progress.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "starling/core/log.hpp"
#include "starling/pb/training.pb.h"

namespace starling::training {
namespace {

using Millis = std::chrono::milliseconds;

double seconds(Duration d) {
  return std::chrono::duration<double>(d).count();
}

std::uint64_t to_ms(Duration d) {
  auto ms = std::chrono::duration_cast<Millis>(d).count();
  return ms < 0 ? 0 : static_cast<std::uint64_t>(ms);
}

}  // namespace

const char* to_string(Action a) {
  switch (a) {
    case Action::accumulate:
      return "accumulate";
    case Action::begin_matchmaking:
      return "begin_matchmaking";
    case Action::average_and_step:
      return "average_and_step";
    case Action::step_alone:
      return "step_alone";
    case Action::download_state:
      return "download_state";
  }
  return "?";
}

namespace {

std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDULL;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ULL;
  x ^= x >> 33;
  return x;
}

}  // namespace

void StateDigest::update(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  len_ += n;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h_ = std::rotl(h_ ^ (w * 0x9E3779B97F4A7C15ULL), 29) * 0xBF58476D1CE4E5B9ULL;
  }
  if (i < n) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + i, n - i);
    h_ = std::rotl(h_ ^ (w * 0x9E3779B97F4A7C15ULL), 29) * 0xBF58476D1CE4E5B9ULL;
  }
}

std::uint64_t StateDigest::value() const {
  const std::uint64_t v = mix64(h_ ^ mix64(len_));
  return v == 0 ? 1 : v;
}

Bytes encode_progress(const PeerProgress& p) {
  pb::training::Progress m;
  m.set_epoch(p.epoch);
  m.set_samples_accumulated(p.samples_accumulated);
  m.set_samples_per_second(p.samples_per_second);
  m.set_seq(p.seq);
  m.set_age_ms(to_ms(p.age_at_publish));
  m.set_ttl_ms(to_ms(p.ttl));
  m.set_samples_total(p.samples_total);
  m.set_client_mode(p.client_mode);
  m.set_auxiliary(p.auxiliary);
  m.set_publish_interval_ms(to_ms(p.publish_interval));
  m.set_digest(p.digest);
  m.set_leaving(p.leaving);
  Bytes out(m.ByteSizeLong());
  m.SerializeToArray(out.data(), static_cast<int>(out.size()));
  return out;
}

result<PeerProgress> decode_progress(BytesView in, const ProgressLimits& limits) {
  if (in.size() > limits.max_record_bytes)
    return make_error(errc::too_large, fmt::format("progress record of {} bytes (limit {})",
                                                   in.size(), limits.max_record_bytes));
  pb::training::Progress m;
  if (!m.ParseFromArray(in.data(), static_cast<int>(in.size())))
    return make_error(errc::invalid_argument, "progress record: not a Progress message");
  const double sps = m.samples_per_second();
  if (!std::isfinite(sps) || sps < 0 || sps > limits.max_samples_per_second)
    return make_error(errc::invalid_argument,
                      fmt::format("progress record: samples_per_second {} out of range", sps));
  if (m.samples_accumulated() > limits.max_samples || m.samples_total() > limits.max_samples)
    return make_error(errc::invalid_argument, "progress record: sample count out of range");
  const auto max_age_ms = to_ms(limits.max_age);
  if (m.age_ms() > max_age_ms || m.ttl_ms() > max_age_ms || m.publish_interval_ms() > max_age_ms)
    return make_error(errc::invalid_argument, "progress record: age or ttl out of range");
  PeerProgress p;
  p.epoch = m.epoch();
  p.samples_accumulated = m.samples_accumulated();
  p.samples_per_second = sps;
  p.seq = m.seq();
  p.age_at_publish = Millis(m.age_ms());
  p.ttl = Millis(m.ttl_ms());
  p.samples_total = m.samples_total();
  p.client_mode = m.client_mode();
  p.auxiliary = m.auxiliary();
  p.publish_interval = Millis(m.publish_interval_ms());
  p.digest = m.digest();
  p.leaving = m.leaving();
  if (p.auxiliary && sps != 0)
    return make_error(errc::invalid_argument, "progress record: auxiliary peer claims samples/s");
  return p;
}

Duration record_age(const PeerProgress& p, Duration remaining_ttl) {
  Duration stored = p.ttl > remaining_ttl ? p.ttl - remaining_ttl : Duration::zero();
  return p.age_at_publish + stored;
}

ProgressTracker::ProgressTracker(net::PeerId self, ProgressConfig config)
    : self_(std::move(self)), config_(config) {
  config_.target_batch_size = std::max<std::uint64_t>(config_.target_batch_size, 1);
  config_.refresh_fraction = std::clamp(config_.refresh_fraction, 0.01, 1.0);
  if (config_.min_refresh > config_.max_refresh)
    std::swap(config_.min_refresh, config_.max_refresh);
  if (!(config_.throughput_half_life_s > 0)) config_.throughput_half_life_s = 10;
}

double ProgressTracker::local_samples_per_second() const noexcept {
  if (config_.auxiliary || ema_seconds_ <= 0) return 0;
  return ema_samples_ / ema_seconds_;
}

void ProgressTracker::report_samples(std::uint64_t samples, Duration compute_time) {
  (background_ ? next_samples_ : samples_) += samples;
  samples_total_ += samples;
  const double dt = std::max(0.0, seconds(compute_time));
  const double decay = std::exp2(-dt / config_.throughput_half_life_s);
  ema_samples_ = ema_samples_ * decay + static_cast<double>(samples);
  ema_seconds_ = ema_seconds_ * decay + dt;
}

void ProgressTracker::set_epoch(std::uint64_t epoch) {
  ++generation_;
  epoch_ = epoch;
  samples_ = 0;
  background_ = false;
  next_samples_ = 0;
}

void ProgressTracker::begin_background_round() {
  background_ = true;
  next_samples_ = 0;
}

void ProgressTracker::end_background_round(bool stepped) {
  if (!background_) return;
  const auto next = next_samples_;
  if (stepped) {
    set_epoch(epoch_ + 1);
    samples_ = next;
  } else {
    background_ = false;
    next_samples_ = 0;
    samples_ += next;
  }
}

void ProgressTracker::start(TimePoint now) {
  hold_alone_until_ = now + config_.startup_grace;
  settle_from_ = hold_alone_until_;
  started_ = now;
  started_epoch_ = epoch_;
}

void ProgressTracker::publish_took(Duration took) {
  if (adapted_grace_ || !started_ || !settle_from_ || config_.startup_grace_min <= Duration::zero())
    return;
  const auto adapted = std::clamp(
      std::chrono::duration_cast<Duration>(took * config_.grace_per_publish),
      config_.startup_grace_min, std::max(config_.startup_grace_min, config_.startup_grace));
  adapted_grace_ = adapted;
  settle_from_ = std::min(*settle_from_, *started_ + adapted);
}

void ProgressTracker::round_failed(TimePoint now) {
  // As long as a live peer's record may look gone: the lifetime of a record published as
  // often as this peer publishes.
  const TimePoint until = now + lifetime(Duration::zero(), config_.max_publish_interval);
  if (!hold_alone_until_ || *hold_alone_until_ < until) hold_alone_until_ = until;
}

void ProgressTracker::fetched(TimePoint began, std::uint64_t gen) {
  confirming_fetch_.emplace(began, gen);
}

bool ProgressTracker::alone_confirmed(TimePoint now) const {
  if (!config_.confirm_alone) return true;
  if (hold_alone_until_ && now < *hold_alone_until_) return false;
  // A fetch that began after the epoch changed (and after the grace) found nobody.
  return confirming_fetch_ && confirming_fetch_->second == generation_ &&
         (!hold_alone_until_ || confirming_fetch_->first >= *hold_alone_until_);
}

bool ProgressTracker::view_settled(TimePoint now) const {
  if (!config_.confirm_alone || !settle_from_) return true;
  // Fetches complete in the order they began (one at a time), so once true it stays true.
  return now >= *settle_from_ && confirming_fetch_ && confirming_fetch_->first >= *settle_from_;
}

void ProgressTracker::round_succeeded(const std::vector<net::PeerId>& members, TimePoint now) {
  for (const auto& m : members) {
    if (m == self_ || !m.valid()) continue;
    auto it = peers_.find(m);
    if (it == peers_.end()) {
      // A member whose record we have not fetched yet: known at this epoch, rate unknown. Any
      // record it publishes replaces this (higher seq).
      PeerProgress p;
      p.epoch = epoch_;
      p.digest = digest_;
      peers_.emplace(m, Held{p, now});
      continue;
    }
    auto& h = it->second;
    if (h.record.epoch >= epoch_) continue;
    // As a fresh record would say: at the new epoch with our parameters, 0 samples at `now`.
    // Keeps seq, so only a newer publication of the peer replaces it.
    h.record.epoch = epoch_;
    h.record.samples_accumulated = 0;
    h.record.digest = digest_;
    h.record.age_at_publish = Duration::zero();
    h.observed_at = now;
  }
}

std::optional<std::uint64_t> ProgressTracker::winning_digest(TimePoint now) const {
  std::map<std::uint64_t, std::size_t> count;
  bool others = false;
  if (digest_ != 0 && !config_.auxiliary) ++count[digest_];
  for (const auto& [id, h] : peers_) {
    if (!live(h, now) || h.record.auxiliary || h.record.epoch != epoch_ || h.record.digest == 0)
      continue;
    ++count[h.record.digest];
    others = true;
  }
  if (!others) return std::nullopt;
  auto best = count.begin();
  for (auto it = count.begin(); it != count.end(); ++it)
    if (std::make_pair(it->second, it->first) > std::make_pair(best->second, best->first))
      best = it;
  return best->first;
}

void ProgressTracker::restore(std::uint64_t epoch, std::uint64_t samples_accumulated,
                              std::uint64_t samples_total) {
  epoch_ = epoch;
  samples_ = samples_accumulated;
  samples_total_ = samples_total;
}

void ProgressTracker::observe(const net::PeerId& peer, const PeerProgress& record, Duration age,
                              TimePoint now) {
  if (peer == self_ || !peer.valid()) return;
  if (age < Duration::zero()) age = Duration::zero();
  if (age > lifetime(record)) return;
  const TimePoint observed_at = now - age;
  if (auto d = departed_.find(peer); d != departed_.end()) {
    if (record.leaving || observed_at <= d->second) return;  // its goodbye, or written before
    departed_.erase(d);  // it came back (a restart with the same identity)
  }
  if (record.leaving) {
    logger("optim")->debug("{} left at epoch {}", peer.short_string(), record.epoch);
    peers_.erase(peer);
    departed_[peer] = observed_at;
    last_departure_ = now;
    return;
  }
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    peers_.emplace(peer, Held{record, observed_at});
    // A peer first seen at the starting epoch, before this one's first epoch change, may
    // have started later than the others (processes start unevenly): peers started with it
    // publish within the adapted wait, so the view settles no sooner than that wait after
    // its record was written (its age says when: a record merely fetched late, written
    // early, extends nothing), and at most startup_grace after start().
    if (adapted_grace_ && settle_from_ && epoch_ == started_epoch_ && record.epoch == epoch_)
      settle_from_ = std::min(*started_ + config_.startup_grace,
                              std::max(*settle_from_, observed_at + *adapted_grace_));
    return;
  }
  // Newer if it has a later sequence number (same run of the peer) or was written later on
  // our clock (a restarted peer counts from 0 again).
  auto& held = it->second;
  if (record.seq <= held.record.seq && observed_at <= held.observed_at) return;
  // Written before we knew the peer at a later epoch (its progress just before a round we
  // stepped in together, fetched after it): not news. Taken as the peer's state it would
  // undercount the peers at this epoch, so the next round's majority (the guard against two
  // disjoint groups both stepping) would be too small.
  if (record.epoch < held.record.epoch && observed_at <= held.observed_at) {
    logger("optim")->debug("progress of {} at epoch {} predates its epoch {}: ignored",
                           peer.short_string(), record.epoch, held.record.epoch);
    return;
  }
  held = Held{record, observed_at};
}

void ProgressTracker::expire(TimePoint now) {
  std::erase_if(peers_, [&](const auto& kv) { return !live(kv.second, now); });
  std::erase_if(departed_, [&](const auto& kv) { return now - kv.second > config_.stale_after; });
}

Duration ProgressTracker::lifetime(const PeerProgress& r) const {
  return lifetime(r.ttl, r.publish_interval);
}

Duration ProgressTracker::lifetime(Duration ttl, Duration publish_interval) const {
  Duration d = config_.stale_after;
  if (ttl > Duration::zero()) d = std::min(d, ttl);
  if (publish_interval > Duration::zero())
    d = std::min(d, 2 * publish_interval + config_.publish_grace);
  return d;
}

bool ProgressTracker::live(const Held& h, TimePoint now) const {
  return now - h.observed_at <= lifetime(h.record);
}

bool ProgressTracker::others_at_epoch(TimePoint now) const {
  for (const auto& [id, h] : peers_)
    if (live(h, now) && !h.record.auxiliary && h.record.epoch >= epoch_) return true;
  return false;
}

template <class EpochPredicate>
std::size_t ProgressTracker::count_computing(EpochPredicate at, TimePoint now) const {
  std::size_t n = at(epoch_) ? 1 : 0;
  for (const auto& [id, h] : peers_)
    if (live(h, now) && !h.record.auxiliary && at(h.record.epoch)) ++n;
  return n;
}

std::size_t ProgressTracker::peers_at(std::uint64_t epoch, TimePoint now) const {
  return count_computing([epoch](std::uint64_t e) { return e == epoch; }, now);
}

std::size_t ProgressTracker::peers_ahead(std::uint64_t epoch, TimePoint now) const {
  return count_computing([epoch](std::uint64_t e) { return e > epoch; }, now);
}

std::uint64_t ProgressTracker::extrapolate(const Held& h, TimePoint now) const {
  const double elapsed =
      std::clamp(seconds(now - h.observed_at), 0.0, seconds(config_.stale_after));
  const auto guess = static_cast<std::uint64_t>(static_cast<double>(h.record.samples_accumulated) +
                                                h.record.samples_per_second * elapsed);
  // With a per-peer share (DiLoCo: H local steps), a peer that reached its share waits for the
  // outer round instead of computing on: extrapolating it past its share made the others start
  // rounds early, every peer then averaged fewer local steps (seen once compute got fast).
  if (config_.per_peer_target > 0)
    return std::min(guess, std::max(config_.per_peer_target, h.record.samples_accumulated));
  return guess;
}

CollaborationView ProgressTracker::view(TimePoint now) const {
  CollaborationView v;
  v.global_epoch = epoch_;
  for (const auto& [id, h] : peers_)
    if (live(h, now)) v.global_epoch = std::max(v.global_epoch, h.record.epoch);

  const std::uint64_t rate_window =
      std::max<std::uint64_t>(config_.epoch_tolerance, config_.delayed_updates ? 1 : 0);
  auto counts_rate = [&](std::uint64_t epoch) { return epoch + rate_window >= v.global_epoch; };
  v.settled = view_settled(now);
  v.num_peers = 1;
  v.num_clients = config_.client_mode ? 1 : 0;
  v.num_auxiliary = config_.auxiliary ? 1 : 0;
  if (epoch_ == v.global_epoch) {
    v.peers_at_global_epoch = 1;
    v.computing_at_global_epoch = config_.auxiliary ? 0 : 1;
    v.samples_accumulated = samples_;
  }
  if (counts_rate(epoch_)) v.samples_per_second = local_samples_per_second();
  std::size_t far_behind = epoch_ + 2 <= v.global_epoch ? 1 : 0;
  v.majority_base = far_behind ? 0 : 1;
  for (const auto& [id, h] : peers_) {
    if (!live(h, now)) continue;
    ++v.num_peers;
    if (h.record.client_mode) ++v.num_clients;
    if (h.record.auxiliary) ++v.num_auxiliary;
    if (h.record.epoch == v.global_epoch) {
      ++v.peers_at_global_epoch;
      if (!h.record.auxiliary) ++v.computing_at_global_epoch;
      v.samples_accumulated += extrapolate(h, now);
    }
    if (counts_rate(h.record.epoch)) v.samples_per_second += h.record.samples_per_second;
    if (h.record.epoch + 2 <= v.global_epoch)
      ++far_behind;
    else
      ++v.majority_base;
  }
  // A peer two or more epochs behind cannot be in this epoch's round before it has downloaded
  // the state (seconds): the round does not wait for it. One epoch behind may be a record
  // written just before the round that moved that peer on: the round waits as before.
  if (v.peers_at_global_epoch + far_behind == v.num_peers) v.all_at_epoch = v.peers_at_global_epoch;
  v.target = config_.per_peer_target > 0
                 ? config_.per_peer_target * std::max<std::size_t>(v.computing_at_global_epoch, 1)
                 : config_.target_batch_size;
  const std::uint64_t target = v.target;
  if (v.samples_accumulated >= target) {
    v.eta = Duration::zero();
  } else if (v.samples_per_second > 0) {
    const double s = static_cast<double>(target - v.samples_accumulated) / v.samples_per_second;
    // Clamp to a day so the conversion cannot overflow.
    v.eta =
        std::chrono::duration_cast<Duration>(std::chrono::duration<double>(std::min(s, 86400.0)));
  }
  return v;
}

Duration ProgressTracker::fetch_interval(const CollaborationView& v, TimePoint now) const {
  // When to look at the others again: a fraction of the ETA, but not past the moment
  // matchmaking should begin.
  // Without an estimate (nobody has reported throughput yet), or while no other peer is known
  // (at startup, or alone), look again soon so joiners are noticed quickly.
  const Duration soon = 4 * config_.min_refresh;
  Duration next = soon;
  if (v.eta) {
    next = std::chrono::duration_cast<Duration>(*v.eta * config_.refresh_fraction);
    if (*v.eta > config_.matchmaking_time) next = std::min(next, *v.eta - config_.matchmaking_time);
    if (v.num_peers == 1) next = std::min(next, soon);
  }
  // Peers one epoch behind have most likely just stepped with us and will publish their new
  // epoch soon: look again shortly rather than estimating from their outdated records.
  for (const auto& [id, h] : peers_)
    if (live(h, now) && h.record.epoch + 1 == epoch_)
      next = std::min(next, 2 * config_.min_refresh);
  next = std::clamp(next, config_.min_refresh, config_.max_refresh);
  // Until the view settled, the fetch that settles it begins as soon as it may.
  if (settle_from_ && !(confirming_fetch_ && confirming_fetch_->first >= *settle_from_))
    next = std::min(next, std::max<Duration>(*settle_from_ - now, Duration::zero()));
  return next;
}

Duration ProgressTracker::next_fetch(TimePoint now) const {
  return fetch_interval(view(now), now);
}

Decision ProgressTracker::decide(TimePoint now) {
  Decision d;
  d.view = view(now);
  const auto& v = d.view;

  d.next_fetch = fetch_interval(v, now);

  if (config_.auxiliary) {
    // An auxiliary peer has no state to fall behind on: it follows the collaboration's epoch
    // and joins a round when at least two computing peers are there to average.
    if (v.global_epoch > epoch_) set_epoch(v.global_epoch);
    std::size_t computing = 0;
    for (const auto& [id, h] : peers_)
      if (live(h, now) && !h.record.auxiliary && h.record.epoch == v.global_epoch) ++computing;
    if (computing < 2) return d;
    if (v.samples_accumulated >= v.target) {
      d.action = Action::average_and_step;
    } else if (v.eta && *v.eta <= config_.matchmaking_time && matchmaking_epoch_ != epoch_) {
      matchmaking_epoch_ = epoch_;
      d.action = Action::begin_matchmaking;
    }
    return d;
  }

  if (background_) return d;  // the round for epoch_ runs; nothing to decide until it ends
  if (v.global_epoch > epoch_ + config_.epoch_tolerance) {
    d.action = Action::download_state;
    return d;
  }
  if (v.global_epoch != epoch_) return d;  // behind within tolerance: keep going

  // Peers at this epoch with other parameters (a fork: e.g. some stepped alone while others
  // averaged): the digest most of them hold wins, the others download that state.
  if (auto w = winning_digest(now); w && digest_ != 0 && *w != digest_) {
    d.action = Action::download_state;
    d.want_digest = *w;
    return d;
  }

  // Until the view settled, a majority of it may be a minority of the peers started with this
  // one: keep accumulating (the samples go into the first round).
  if (!v.settled) return d;

  if (v.samples_accumulated >= v.target) {
    // Partners: computing peers at this epoch, or one behind (most likely they have just
    // stepped to it and their record is not here yet). Stepping alone while they step together
    // would fork the parameters; if they are really behind, the round fails and is retried.
    bool others = false;
    for (const auto& [id, h] : peers_)
      if (live(h, now) && !h.record.auxiliary && h.record.epoch + 1 >= epoch_) others = true;
    if (others)
      d.action = Action::average_and_step;
    else if (alone_confirmed(now))
      d.action = Action::step_alone;
    return d;
  }
  if (v.eta && *v.eta <= config_.matchmaking_time && matchmaking_epoch_ != epoch_ &&
      v.peers_at_global_epoch > 1) {
    matchmaking_epoch_ = epoch_;
    d.action = Action::begin_matchmaking;
  }
  return d;
}

PeerProgress ProgressTracker::make_record(TimePoint now, Duration ttl) {
  PeerProgress p;
  p.epoch = epoch_;
  p.samples_accumulated = samples_;
  p.samples_per_second = local_samples_per_second();
  p.seq = ++seq_;
  p.ttl = ttl;
  p.samples_total = samples_total_;
  p.client_mode = config_.client_mode;
  p.auxiliary = config_.auxiliary;
  p.publish_interval = config_.max_publish_interval;
  p.digest = config_.auxiliary ? 0 : digest_;
  last_publish_ = now;
  published_epoch_ = epoch_;
  published_digest_ = digest_;
  return p;
}

bool ProgressTracker::should_publish(TimePoint now) const {
  if (!last_publish_) return true;
  if (published_epoch_ != epoch_ || published_digest_ != digest_) return true;
  return now - *last_publish_ >= config_.max_publish_interval;
}

}  // namespace starling::training
