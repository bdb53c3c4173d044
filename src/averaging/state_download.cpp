#include "state_download.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "starling/averaging/schema.hpp"
#include "starling/averaging/wire.hpp"
#include "starling/core/log.hpp"
#include "starling/core/thread_pool.hpp"

namespace starling::averaging::detail {
namespace {

struct HashPart {
  const Bytes* v;
  Bytes operator()() const { return blake2b_256(*v); }
};

}  // namespace

StateDownload::StateDownload(net::StreamHost& host, ThreadPool& pool, AddressSink sink,
                             Target target, LoadStateOptions opts, TimePoint deadline)
    : host_(host),
      pool_(pool),
      sink_(std::move(sink)),
      target_(std::move(target)),
      opts_(opts),
      deadline_(deadline),
      changed_(host.get_executor()) {}

awaitable<result<std::shared_ptr<StateDonor>>> StateDownload::open_donor(net::PeerId id,
                                                                         PeerKey peer,
                                                                         Duration left) {
  ST_CO_TRY(auto s, co_await host_.open_stream(id, target_.protocol, left));
  auto d = std::make_shared<StateDonor>();
  d->peer = std::move(peer);
  d->stream = s;
  d->reader = std::make_shared<net::BufferedReader>(*s);
  StateRequest req;
  req.manifest = true;
  const Bytes frame = net::length_prefixed(wire::encode_state_request(req));
  auto w = co_await s->write(frame);
  if (!w) {
    s->reset();
    co_return w.error();
  }
  auto fb = co_await d->reader->read_length_prefixed(wire::kMaxFrame);
  if (!fb) {
    s->reset();
    co_return fb.error();
  }
  auto f = wire::decode_state_frame(fb.value());
  if (!f || !f.value().manifest) {
    s->reset();
    if (!f) co_return f.error();
    co_return make_error(errc::unavailable, "donor has no state: " + f.value().error);
  }
  d->manifest = std::move(*f.value().manifest);
  co_return d;
}

awaitable<void> StateDownload::ask_manifest(StateAnnouncement a) {
  auto self = shared_from_this();
  struct Dec {
    StateDownload* s;
    ~Dec() {
      if (--s->pending_ == 0) s->changed_.set();
    }
  } dec{this};
  auto id = net::PeerId::from_bytes(a.donor.peer.bytes());
  if (!id) co_return;
  if (sink_ && !a.donor.addrs.empty()) sink_(id.value(), a.donor.addrs);
  const Duration left = std::min<Duration>(deadline_ - Clock::now(), 20s);
  auto r =
      co_await with_timeout(open_donor(id.value(), a.donor.peer, left), left, "state manifest");
  if (!r) {
    logger("averaging")
        ->info("load_state: donor {}: {}", a.donor.peer.short_hex(), r.error().message());
    co_return;
  }
  donors_.push_back(std::move(r).value());
  changed_.set();
}

std::vector<PeerKey> StateDownload::chosen_donors() const {
  std::vector<PeerKey> out;
  for (const auto& d : use_) out.push_back(d->peer);
  return out;
}

result<void> StateDownload::choose_snapshot() {
  std::map<Bytes, std::vector<std::shared_ptr<StateDonor>>> by_snap;
  std::vector<std::uint64_t> epochs;
  for (auto& d : donors_) epochs.push_back(d->manifest.epoch);
  const std::uint64_t median = lower_median(epochs);
  for (auto& d : donors_) {
    if (d->manifest.epoch > median && d->manifest.epoch - median > opts_.max_epoch_lead) {
      logger("averaging")
          ->warn(
              "load_state: donor {} claims epoch {}, more than {} ahead of the median {}: "
              "refused",
              d->peer.short_hex(), d->manifest.epoch, opts_.max_epoch_lead, median);
      d->stream->reset();
      continue;
    }
    const auto& m = d->manifest;
    const bool size_ok = target_.size ? m.size == *target_.size : m.size <= target_.max_bytes;
    if (m.schema_hash != target_.kind || !size_ok || !validate_manifest(m)) {
      if (m.size > target_.max_bytes) too_large_ = true;
      logger("averaging")
          ->info("load_state: donor {}: unusable manifest ({} bytes)", d->peer.short_hex(), m.size);
      d->stream->reset();
      continue;
    }
    by_snap[d->manifest.snapshot].push_back(d);
  }
  if (by_snap.empty()) {
    if (too_large_)
      return make_error(errc::too_large, "load_state: the donors' state is above the limit of " +
                                             std::to_string(target_.max_bytes) + " bytes");
    return make_error(errc::unavailable, "load_state: no donor answered with a usable manifest");
  }
  // Preferred metadata first, then the highest epoch, then the most donors.
  auto rank = [&](const auto& it) {
    const auto& m = it->second.front()->manifest;
    const bool preferred = !opts_.prefer_metadata.empty() && m.metadata == opts_.prefer_metadata;
    return std::make_tuple(preferred, m.epoch, it->second.size());
  };
  auto best = by_snap.begin();
  for (auto it = by_snap.begin(); it != by_snap.end(); ++it)
    if (rank(it) > rank(best)) best = it;
  use_ = best->second;
  for (auto& [id, ds] : by_snap)
    if (id != best->first)
      for (auto& d : ds) d->stream->reset();
  if (use_.size() > opts_.max_donors) {
    for (std::size_t i = opts_.max_donors; i < use_.size(); ++i) use_[i]->stream->reset();
    use_.resize(opts_.max_donors);
  }
  manifest_ = use_.front()->manifest;
  return success();
}

awaitable<result<void>> StateDownload::fetch(StateDonor& d, const std::vector<std::uint32_t>& batch,
                                             std::size_t& done_in_batch) {
  StateRequest req;
  req.snapshot = manifest_.snapshot;
  req.parts = batch;
  const Bytes frame = net::length_prefixed(wire::encode_state_request(req));
  ST_CO_TRY(co_await d.stream->write(frame));
  const std::size_t ps = manifest_.part_size;
  for (auto p : batch) {
    ST_CO_TRY(auto fb, co_await with_timeout(d.reader->read_length_prefixed(wire::kMaxFrame),
                                             opts_.stall_timeout, "state part header"));
    ST_CO_TRY(auto f, wire::decode_state_frame(fb));
    const std::size_t b = std::size_t{p} * ps;
    const std::size_t len = std::min<std::size_t>(ps, manifest_.size - b);
    if (!f.part || *f.part != p || f.payload_len != len)
      co_return make_error(errc::protocol_violation, "donor sent the wrong part: " + f.error);
    Bytes tmp(len);
    MutableBytesView dst(tmp.data(), tmp.size());
    ST_CO_TRY(co_await with_timeout(d.reader->read_exact(dst), opts_.stall_timeout, "state part"));
    HashPart task{&tmp};
    ST_CO_TRY(auto h, co_await pool_.run(task));
    if (h != manifest_.part_hashes[p])
      co_return make_error(errc::protocol_violation,
                           "part " + std::to_string(p) + " does not match its hash");
    if (!have_[p]) {
      // The buffer grows as verified parts arrive (parts are requested in order), never to
      // the manifest's claimed size up front.
      if (buf_.size() < b + len) buf_.resize(b + len);
      std::copy(tmp.begin(), tmp.end(), buf_.begin() + static_cast<std::ptrdiff_t>(b));
      have_[p] = true;
      ++have_count_;
    }
    bytes_ += len;
    ++done_in_batch;
    --in_flight_;
    d.served = true;
    changed_.set();
  }
  co_return success();
}

awaitable<void> StateDownload::worker(std::shared_ptr<StateDonor> d) {
  auto self = shared_from_this();
  struct Dec {
    StateDownload* s;
    ~Dec() {
      --s->workers_;
      s->changed_.set();
    }
  } dec{this};
  const std::size_t nparts = manifest_.part_hashes.size();
  for (;;) {
    if (have_count_ == nparts) co_return;
    if (queue_.empty()) {
      if (in_flight_ == 0) co_return;
      changed_.reset();
      if (!co_await with_timeout(changed_.wait(), 1s, "state queue") && Clock::now() > deadline_)
        co_return;
      continue;
    }
    std::vector<std::uint32_t> batch;
    while (!queue_.empty() && batch.size() < opts_.parts_per_request) {
      batch.push_back(queue_.front());
      queue_.pop_front();
    }
    in_flight_ += batch.size();
    std::size_t done_in_batch = 0;
    auto r = co_await fetch(*d, batch, done_in_batch);
    if (!r) {
      logger("averaging")
          ->warn("load_state: dropping donor {}: {}", d->peer.short_hex(), r.error().message());
      for (std::size_t i = batch.size(); i-- > done_in_batch;) {
        queue_.push_front(batch[i]);
        ++retried_;
      }
      in_flight_ -= batch.size() - done_in_batch;
      d->stream->reset();
      changed_.set();
      co_return;
    }
  }
}

awaitable<result<StateInfo>> StateDownload::run(std::vector<StateAnnouncement> candidates) {
  auto self = shared_from_this();
  const TimePoint t0 = Clock::now();
  // 1. Manifests from the candidates, in parallel. Once one answered, the others get a grace
  // (kManifestGrace, or as long again as the first took) rather than until the deadline: a
  // donor whose training thread is busy (in a long round) must not hold a newcomer for 20 s
  // while the collaboration moves on without it.
  {
    TaskScope scope(host_.get_executor());
    pending_ = candidates.size();
    for (auto& a : candidates) scope.spawn(ask_manifest(std::move(a)));
    std::optional<TimePoint> grace_end;
    while (pending_ > 0) {
      const TimePoint now = Clock::now();
      if (!donors_.empty() && !grace_end)
        grace_end = now + std::max<Duration>(kManifestGrace, now - t0);
      const TimePoint until = grace_end ? std::min(*grace_end, deadline_) : deadline_;
      if (now >= until) break;
      changed_.reset();
      if (!co_await with_timeout(changed_.wait(), until - now, "manifests") && !grace_end) break;
    }
    (void)co_await scope.close(2s);
  }
  // 2. The snapshot with the highest epoch held by the most donors.
  ST_CO_TRY(choose_snapshot());
  // 3. Parts in parallel from every chosen donor.
  const std::size_t nparts = manifest_.part_hashes.size();
  buf_.clear();
  for (std::uint32_t p = 0; p < nparts; ++p) queue_.push_back(p);
  have_.assign(nparts, false);
  {
    TaskScope scope(host_.get_executor());
    workers_ = use_.size();
    for (auto& d : use_) scope.spawn(worker(d));
    while (workers_ > 0 && Clock::now() < deadline_) {
      changed_.reset();
      (void)co_await with_timeout(changed_.wait(), deadline_ - Clock::now(), "state download");
    }
    for (auto& d : use_) d->stream->reset();
    (void)co_await scope.close(2s);
  }
  if (have_count_ != nparts)
    co_return make_error(Clock::now() >= deadline_ ? errc::timeout : errc::unavailable,
                         "load_state: " + std::to_string(nparts - have_count_) + " of " +
                             std::to_string(nparts) + " parts missing after every donor failed");
  StateInfo info;
  info.epoch = manifest_.epoch;
  info.metadata = manifest_.metadata;
  for (auto& d : use_) info.donors += d->served;
  info.parts = nparts;
  info.parts_retried = retried_;
  info.bytes = bytes_;
  info.time = Clock::now() - t0;
  co_return info;
}

}  // namespace starling::averaging::detail
