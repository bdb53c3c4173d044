// State transfer (state_transfer.hpp): the donor's snapshot, announcement and server, and the
// newcomer's parallel, verified, resumable download.

#include "averager_impl.hpp"
#include "starling/core/log.hpp"
#include "starling/core/thread_pool.hpp"
#include "state_download.hpp"

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
  HashParts task{snap.get()};
  auto hashes = co_await pool_->run(task);
  if (!hashes) co_return hashes.error();
  m.part_hashes = std::move(hashes).value();
  m.snapshot = snapshot_id(m);
  impl_->snapshot = snap;
  StateAnnouncement a{self_info(0), epoch, schema_hash_,
                      WallClock::now() + std::chrono::duration_cast<WallClock::duration>(ttl)};
  co_return co_await directory_->put(state_key(), a.donor.peer.bytes(),
                                     wire::encode_announcement(a), a.expires);
}

awaitable<void> Averager::serve_state(net::ByteStreamPtr s, net::PeerId remote) {
  auto self = shared_from_this();
  net::BufferedReader r(*s);
  for (;;) {
    auto frame =
        co_await with_timeout(r.read_length_prefixed(wire::kMaxFrame), kStateIdle, "state request");
    if (!frame) break;
    auto req = wire::decode_state_request(frame.value());
    if (!req) {
      logger("averaging")
          ->warn("state stream from {}: {}", remote.short_string(), req.error().message());
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
      StateFrame f;
      f.error = "unknown snapshot";
      w = co_await write_frame(*s, f);
    } else {
      const std::size_t pe = snap->manifest.part_elems;
      for (auto p : req.value().parts) {
        if (p >= snap->manifest.part_hashes.size()) {
          StateFrame f;
          f.error = "part out of range";
          w = co_await write_frame(*s, f);
          break;
        }
        const std::size_t b = std::size_t{p} * pe;
        auto data =
            std::span<const float>(snap->data).subspan(b, std::min(pe, snap->data.size() - b));
        StateFrame f;
        f.part = p;
        f.payload_len = data.size_bytes();
        w = co_await write_frame(*s, f, data);
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

  // 2-4. Manifests, the best snapshot, parts from several donors (state_download.cpp).
  auto dl = std::make_shared<detail::StateDownload>(*host_, *pool_, add_addresses_, schema_hash_,
                                                    schema_.numel(), opts, deadline);
  auto info = co_await dl->run(std::move(anns));
  if (!info) co_return info.error();
  scatter_flat(tensors_, 0, dl->data());
  StateInfo out = std::move(info).value();
  out.time = Clock::now() - t0;
  co_return out;
}

}  // namespace starling::averaging
