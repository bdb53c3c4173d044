// State transfer (state_transfer.hpp): the donor's snapshot, announcement and server, and the
// newcomer's parallel, verified, resumable download.
#include <asio/co_spawn.hpp>
#include <asio/use_awaitable.hpp>
#include <deque>
#include <set>

#include "averager_impl.hpp"
#include "starling/core/log.hpp"
#include "starling/core/thread_pool.hpp"

namespace starling::averaging {
namespace {

constexpr Duration kStateIdle = 60s;  // a state stream with no request for this long is closed

BytesView float_bytes(std::span<const float> f) {
  return {reinterpret_cast<const std::uint8_t*>(f.data()), f.size_bytes()};
}

awaitable<result<void>> write_frame(net::ByteStream& s, const StateFrame& f,
                                    std::span<const float> payload = {}) {
  ST_CO_TRY(co_await s.write(net::length_prefixed(wire::encode_state_frame(f))));
  if (!payload.empty()) ST_CO_TRY(co_await s.write(float_bytes(payload)));
  co_return success();
}

// Pool tasks (plain function objects: GCC 12 mishandles lambdas nested in coroutine lambdas).
struct HashParts {
  const StateSnapshot* snap;
  std::vector<Bytes> operator()() const {
    std::vector<Bytes> hs;
    const std::size_t pe = snap->manifest.part_elems;
    std::span<const float> all(snap->data);
    for (std::size_t b = 0; b < all.size(); b += pe)
      hs.push_back(blake2b_256(float_bytes(all.subspan(b, std::min(pe, all.size() - b)))));
    return hs;
  }
};
struct HashFloats {
  const std::vector<float>* v;
  Bytes operator()() const { return blake2b_256(float_bytes(*v)); }
};

// One donor during a download.
struct Donor {
  PeerKey peer;
  net::ByteStreamPtr stream;
  std::shared_ptr<net::BufferedReader> reader;
  StateManifest manifest;
  bool served = false;
};

}  // namespace

Bytes Averager::state_key() const {
  return blake2b_256(as_bytes("starling/averaging/state/" + cfg_.key.prefix));
}

awaitable<result<void>> Averager::share_state(std::uint64_t epoch, Bytes metadata, Duration ttl) {
  auto self = shared_from_this();
  if (metadata.size() > wire::kMaxMetadata)
    co_return make_error(errc::too_large, "share_state: metadata above 64 KiB");
  auto snap = std::make_shared<StateSnapshot>();
  snap->data.resize(schema_.numel());
  gather_flat(tensors_, 0, snap->data);
  auto& m = snap->manifest;
  m.epoch = epoch;
  m.metadata = std::move(metadata);
  m.schema_hash = schema_hash_;
  m.elements = snap->data.size();
  m.part_elems = static_cast<std::uint32_t>(cfg_.round.part_elems);
  // Hash the parts on the worker pool, not on the I/O thread.
  auto hashes = co_await pool_->run(HashParts{snap.get()});
  if (!hashes) co_return hashes.error();
  m.part_hashes = std::move(hashes).value();
  m.snapshot = snapshot_id(m);
  impl_->snapshot = snap;
  StateAnnouncement a{self_info(0), epoch, schema_hash_, WallClock::now() + std::chrono::duration_cast<WallClock::duration>(ttl)};
  co_return co_await directory_->put(state_key(), a.donor.peer.bytes(),
                                     wire::encode_announcement(a), a.expires);
}

awaitable<void> Averager::serve_state(net::ByteStreamPtr s, net::PeerId remote) {
  auto self = shared_from_this();
  net::BufferedReader r(*s);
  for (;;) {
    auto frame = co_await with_timeout(r.read_length_prefixed(wire::kMaxFrame), kStateIdle,
                                       "state request");
    if (!frame) break;
    auto req = wire::decode_state_request(frame.value());
    if (!req) {
      logger("averaging")->warn("state stream from {}: {}", remote.short_string(),
                                req.error().message());
      break;
    }
    auto snap = impl_->snapshot;  // keeps this snapshot alive while serving it
    result<void> w = success();
    if (req.value().manifest) {
      StateFrame f;
      if (snap)
        f.manifest = snap->manifest;
      else
        f.error = "no state shared";
      w = co_await write_frame(*s, f);
    } else if (!snap || snap->manifest.snapshot != req.value().snapshot) {
      w = co_await write_frame(*s, StateFrame{{}, {}, 0, "unknown snapshot"});
    } else {
      const std::size_t pe = snap->manifest.part_elems;
      for (auto p : req.value().parts) {
        if (p >= snap->manifest.part_hashes.size()) {
          w = co_await write_frame(*s, StateFrame{{}, {}, 0, "part out of range"});
          break;
        }
        const std::size_t b = std::size_t{p} * pe;
        auto data = std::span<const float>(snap->data).subspan(b, std::min(pe, snap->data.size() - b));
        w = co_await write_frame(*s, StateFrame{{}, p, data.size_bytes(), {}}, data);
        if (!w) break;
      }
    }
    if (!w) break;
  }
  s->reset();
}

awaitable<result<StateInfo>> Averager::load_state(LoadStateOptions opts) {
  auto self = shared_from_this();
  if (!impl_->started) start();
  const TimePoint t0 = Clock::now();
  const TimePoint deadline = t0 + opts.timeout;
  opts.max_donors = std::max<std::size_t>(1, opts.max_donors);
  opts.parts_per_request = std::clamp<std::size_t>(opts.parts_per_request, 1, 64);
  const PeerKey me(host_->local_peer().bytes());

  // 1. Who announces a state with our schema.
  auto got = co_await directory_->get(state_key());
  if (!got) co_return got.error().with_context("load_state: reading announcements");
  std::vector<StateAnnouncement> anns;
  for (const auto& v : got.value()) {
    auto a = wire::decode_announcement(v);
    if (!a || a.value().schema_hash != schema_hash_ || a.value().donor.peer == me ||
        a.value().expires <= WallClock::now())
      continue;
    anns.push_back(std::move(a).value());
  }
  if (anns.empty())
    co_return make_error(errc::not_found, "load_state: nobody announces a state for " +
                                              cfg_.key.prefix + " with this schema");
  std::sort(anns.begin(), anns.end(),
            [](const auto& x, const auto& y) { return x.epoch > y.epoch; });
  if (anns.size() > 2 * opts.max_donors) anns.resize(2 * opts.max_donors);

  // 2. Manifests from the candidates, in parallel.
  std::vector<std::shared_ptr<Donor>> donors;
  {
    TaskScope scope(host_->get_executor());
    AsyncEvent done(host_->get_executor());
    std::size_t pending = anns.size();
    for (const auto& a : anns) {
      scope.spawn([this, self, a, &donors, &done, &pending, deadline]() -> awaitable<void> {
        struct Dec {
          std::size_t& p;
          AsyncEvent& d;
          ~Dec() {
            if (--p == 0) d.set();
          }
        } dec{pending, done};
        auto id = net::PeerId::from_bytes(a.donor.peer.bytes());
        if (!id) co_return;
        if (add_addresses_ && !a.donor.addrs.empty()) add_addresses_(id.value(), a.donor.addrs);
        const Duration left = std::min<Duration>(deadline - Clock::now(), 20s);
        auto op = [&]() -> awaitable<result<std::shared_ptr<Donor>>> {
          ST_CO_TRY(auto s, co_await host_->open_stream(id.value(), kStateProtocol, left));
          auto d = std::make_shared<Donor>();
          d->peer = a.donor.peer;
          d->stream = s;
          d->reader = std::make_shared<net::BufferedReader>(*s);
          ST_CO_TRY(co_await s->write(net::length_prefixed(
              wire::encode_state_request(StateRequest{true, {}, {}}))));
          ST_CO_TRY(auto fb, co_await d->reader->read_length_prefixed(wire::kMaxFrame));
          ST_CO_TRY(auto f, wire::decode_state_frame(fb));
          if (!f.manifest)
            co_return make_error(errc::unavailable, "donor has no state: " + f.error);
          d->manifest = std::move(*f.manifest);
          co_return d;
        };
        auto r = co_await with_timeout(op(), left, "state manifest");
        if (!r) {
          logger("averaging")->info("load_state: donor {}: {}", a.donor.peer.short_hex(),
                                    r.error().message());
          co_return;
        }
        donors.push_back(std::move(r).value());
      });
    }
    while (pending > 0) {
      done.reset();
      if (!co_await with_timeout(done.wait(), std::max<Duration>(deadline - Clock::now(), 1ms),
                                 "manifests"))
        break;
    }
    (void)co_await scope.close(2s);
  }
  // 3. The snapshot with the highest epoch held by the most donors.
  std::map<Bytes, std::vector<std::shared_ptr<Donor>>> by_snap;
  for (auto& d : donors) {
    if (d->manifest.schema_hash != schema_hash_ || d->manifest.elements != schema_.numel()) {
      d->stream->reset();
      continue;
    }
    by_snap[d->manifest.snapshot].push_back(d);
  }
  if (by_snap.empty())
    co_return make_error(errc::unavailable, "load_state: no donor answered with a usable manifest");
  auto best = by_snap.begin();
  for (auto it = by_snap.begin(); it != by_snap.end(); ++it) {
    const auto& m = it->second.front()->manifest;
    const auto& bm = best->second.front()->manifest;
    if (std::make_pair(m.epoch, it->second.size()) > std::make_pair(bm.epoch, best->second.size()))
      best = it;
  }
  std::vector<std::shared_ptr<Donor>> use = best->second;
  for (auto& [id, ds] : by_snap)
    if (id != best->first)
      for (auto& d : ds) d->stream->reset();
  if (use.size() > opts.max_donors) {
    for (std::size_t i = opts.max_donors; i < use.size(); ++i) use[i]->stream->reset();
    use.resize(opts.max_donors);
  }
  const StateManifest manifest = use.front()->manifest;

  // 4. Parts in parallel from every chosen donor; a failing donor's parts go back in the queue.
  const std::size_t nparts = manifest.part_hashes.size();
  const std::size_t pe = manifest.part_elems;
  std::vector<float> buf(manifest.elements);
  std::deque<std::uint32_t> queue;
  for (std::uint32_t p = 0; p < nparts; ++p) queue.push_back(p);
  std::vector<bool> have(nparts, false);
  std::size_t have_count = 0, in_flight = 0, retried = 0;
  std::uint64_t bytes = 0;
  AsyncEvent changed(host_->get_executor());
  {
    TaskScope scope(host_->get_executor());
    std::size_t workers = use.size();
    for (auto& d : use) {
      scope.spawn([&, d]() -> awaitable<void> {
        struct Dec {
          std::size_t& w;
          AsyncEvent& c;
          ~Dec() {
            --w;
            c.set();
          }
        } dec{workers, changed};
        for (;;) {
          if (have_count == nparts) co_return;
          if (queue.empty()) {
            if (in_flight == 0) co_return;
            changed.reset();
            if (!co_await with_timeout(changed.wait(), 1s, "state queue") &&
                Clock::now() > deadline)
              co_return;
            continue;
          }
          std::vector<std::uint32_t> batch;
          while (!queue.empty() && batch.size() < opts.parts_per_request) {
            batch.push_back(queue.front());
            queue.pop_front();
          }
          in_flight += batch.size();
          std::size_t done_in_batch = 0;
          auto fetch = [&]() -> awaitable<result<void>> {
            ST_CO_TRY(co_await d->stream->write(net::length_prefixed(
                wire::encode_state_request(StateRequest{false, manifest.snapshot, batch}))));
            for (auto p : batch) {
              ST_CO_TRY(auto fb, co_await with_timeout(
                                     d->reader->read_length_prefixed(wire::kMaxFrame),
                                     opts.stall_timeout, "state part header"));
              ST_CO_TRY(auto f, wire::decode_state_frame(fb));
              const std::size_t b = std::size_t{p} * pe;
              const std::size_t len = std::min(pe, buf.size() - b);
              if (!f.part || *f.part != p || f.payload_len != len * sizeof(float))
                co_return make_error(errc::protocol_violation,
                                     "donor sent the wrong part: " + f.error);
              std::vector<float> tmp(len);
              MutableBytesView dst(reinterpret_cast<std::uint8_t*>(tmp.data()), len * sizeof(float));
              ST_CO_TRY(co_await with_timeout(d->reader->read_exact(dst), opts.stall_timeout,
                                              "state part"));
              ST_CO_TRY(auto h, co_await pool_->run(HashFloats{&tmp}));
              if (h != manifest.part_hashes[p])
                co_return make_error(errc::protocol_violation,
                                     "part " + std::to_string(p) + " does not match its hash");
              if (!have[p]) {
                std::copy(tmp.begin(), tmp.end(), buf.begin() + static_cast<std::ptrdiff_t>(b));
                have[p] = true;
                ++have_count;
              }
              bytes += len * sizeof(float);
              ++done_in_batch;
              --in_flight;
              d->served = true;
              changed.set();
            }
            co_return success();
          };
          auto r = co_await fetch();
          if (!r) {
            logger("averaging")->warn("load_state: dropping donor {}: {}", d->peer.short_hex(),
                                      r.error().message());
            for (std::size_t i = batch.size(); i-- > done_in_batch;) {
              queue.push_front(batch[i]);
              ++retried;
            }
            in_flight -= batch.size() - done_in_batch;
            d->stream->reset();
            changed.set();
            co_return;
          }
        }
      });
    }
    while (workers > 0 && Clock::now() < deadline) {
      changed.reset();
      (void)co_await with_timeout(changed.wait(), deadline - Clock::now(), "state download");
    }
    for (auto& d : use) d->stream->reset();
    (void)co_await scope.close(2s);
  }
  if (have_count != nparts)
    co_return make_error(Clock::now() >= deadline ? errc::timeout : errc::unavailable,
                         "load_state: " + std::to_string(nparts - have_count) + " of " +
                             std::to_string(nparts) + " parts missing after every donor failed");
  scatter_flat(tensors_, 0, buf);
  StateInfo info;
  info.epoch = manifest.epoch;
  info.metadata = manifest.metadata;
  for (auto& d : use) info.donors += d->served;
  info.parts = nparts;
  info.parts_retried = retried;
  info.bytes = bytes;
  info.time = Clock::now() - t0;
  co_return info;
}

}  // namespace starling::averaging
