// State transfer (state_transfer.hpp): the donor's snapshot, announcement and server (tensor
// snapshots and byte blobs), and the newcomer's side (StateDownload does the transfer).

#include <cstring>
#include <set>

#include "averager_impl.hpp"
#include "starling/core/log.hpp"
#include "starling/core/thread_pool.hpp"
#include "state_download.hpp"

namespace starling::averaging {
namespace {

constexpr Duration kStateIdle = 60s;   // a state stream with no request for this long is closed
constexpr Duration kSourceWait = 30s;  // a blob source must answer within this

constexpr Duration kStateWrite = 60s;  // a reader that takes no frame for this long is dropped

awaitable<result<void>> write_frame_now(net::ByteStream& s, const StateFrame& f,
                                        BytesView payload) {
  ST_CO_TRY(co_await s.write(net::length_prefixed(wire::encode_state_frame(f))));
  if (!payload.empty()) ST_CO_TRY(co_await s.write(payload));
  co_return success();
}

// Bounded: a reader that stops reading would otherwise hold this handler (and the snapshot it
// serves) for as long as it keeps the connection alive.
awaitable<result<void>> write_frame(net::ByteStream& s, const StateFrame& f,
                                    BytesView payload = {}) {
  co_return co_await with_timeout(write_frame_now(s, f, payload), kStateWrite, "state write");
}

// Pool tasks (plain function objects: GCC 12 mishandles lambdas nested in coroutine lambdas).
struct HashParts {
  const StateSnapshot* snap;
  std::vector<Bytes> operator()() const {
    std::vector<Bytes> hs;
    const std::size_t ps = snap->manifest.part_size;
    BytesView all(snap->data);
    for (std::size_t b = 0; b < all.size(); b += ps)
      hs.push_back(blake2b_256(all.subspan(b, std::min(ps, all.size() - b))));
    return hs;
  }
};

struct GatherBytes {
  const std::vector<TensorView>* views;
  std::uint64_t numel;
  Bytes operator()() const {
    std::vector<float> flat(numel);
    gather_flat(*views, 0, flat);
    Bytes out(flat.size() * sizeof(float));
    if (!flat.empty()) std::memcpy(out.data(), flat.data(), out.size());
    return out;
  }
};

awaitable<result<BlobSnapshot>> call_source(Averager::BlobSource source) {
  co_return co_await source();
}

}  // namespace

std::string averaging_protocol(const char* base, const std::string& prefix) {
  return std::string(base) + "/" + prefix;
}

std::uint64_t Averager::state_bytes_served() const noexcept {
  return impl_->state_bytes_served;
}

Bytes Averager::state_key() const {
  return blake2b_256(as_bytes("starling/averaging/state/" + cfg_.key.prefix));
}

awaitable<result<void>> Averager::install_snapshot(std::uint64_t epoch, Bytes data, Bytes metadata,
                                                   const Bytes& kind, std::size_t part_size) {
  auto self = shared_from_this();
  if (metadata.size() > wire::kMaxMetadata)
    co_return make_error(errc::too_large, "share_state: metadata above 64 KiB");
  auto snap = std::make_shared<StateSnapshot>();
  snap->data = std::move(data);
  auto& m = snap->manifest;
  m.epoch = epoch;
  m.metadata = std::move(metadata);
  m.schema_hash = kind;
  m.size = snap->data.size();
  m.part_size = static_cast<std::uint32_t>(part_size);
  // Hash the parts on the worker pool, not on the I/O thread.
  HashParts task{snap.get()};
  auto hashes = co_await pool_->run(task);
  if (!hashes) co_return hashes.error();
  m.part_hashes = std::move(hashes).value();
  m.snapshot = snapshot_id(m);
  if (impl_->snapshot && impl_->snapshot->manifest.snapshot != m.snapshot)
    impl_->previous = impl_->snapshot;
  impl_->snapshot = snap;
  co_return success();
}

awaitable<result<void>> Averager::announce(std::uint64_t epoch, const Bytes& kind, Duration ttl) {
  auto self = shared_from_this();
  StateAnnouncement a;
  a.donor = self_info(0);
  a.epoch = epoch;
  a.schema_hash = kind;
  a.expires = WallClock::now() + std::chrono::duration_cast<WallClock::duration>(ttl);
  co_return co_await directory_->put(state_key(), a.donor.peer.bytes(),
                                     wire::encode_announcement(a), a.expires);
}

namespace {
result<void> have_tensors(const std::vector<TensorView>& tensors, const Schema& schema) {
  if (tensors.empty() && !schema.tensors.empty())
    return make_error(errc::invalid_argument,
                      "averager: created without tensors, it has no tensor state to transfer");
  return success();
}
}  // namespace

awaitable<result<void>> Averager::share_state(std::uint64_t epoch, Bytes metadata, Duration ttl) {
  auto self = shared_from_this();
  ST_CO_TRY(have_tensors(tensors_, schema_));
  GatherBytes gather;
  gather.views = &tensors_;
  gather.numel = schema_.numel();
  ST_CO_TRY(auto data, co_await pool_->run(gather));
  ST_CO_TRY(co_await install_snapshot(epoch, std::move(data), std::move(metadata), schema_hash_,
                                      cfg_.round.part_elems * sizeof(float)));
  co_return co_await announce(epoch, schema_hash_, ttl);
}

awaitable<result<void>> Averager::share_blob(BlobSnapshot blob, Duration ttl) {
  auto self = shared_from_this();
  const std::uint64_t epoch = blob.epoch;
  ST_CO_TRY(co_await install_snapshot(epoch, std::move(blob.data), std::move(blob.metadata),
                                      blob_kind(), cfg_.blob_part_bytes));
  co_return co_await announce(epoch, blob_kind(), ttl);
}

void Averager::set_blob_source(BlobSource source) {
  impl_->blob_source = std::move(source);
  if (!impl_->blob_source && impl_->snapshot &&
      impl_->snapshot->manifest.schema_hash == blob_kind()) {
    impl_->snapshot.reset();
    impl_->previous.reset();
  }
  if (!impl_->started) start();
}

awaitable<result<void>> Averager::announce_blob(std::uint64_t epoch, Duration ttl) {
  co_return co_await announce(epoch, blob_kind(), ttl);
}

awaitable<void> Averager::serve_state(net::ByteStreamPtr s, net::PeerId remote) {
  auto self = shared_from_this();
  net::BufferedReader r(*s);
  // The snapshot whose manifest this stream got: its parts stay servable on this stream even
  // after newer snapshots replaced it (a donor stepping every few hundred ms replaced two
  // while a newcomer fetched, and the download failed with "unknown snapshot").
  std::shared_ptr<const StateSnapshot> given;
  if (auto gate = cfg_.gate) {  // a private run: members only
    const bool admitted = co_await gate->admit(remote);
    if (!admitted) {
      logger("averaging")
          ->info("state request from {}: not a member of this run", remote.short_string());
      StateFrame f;
      f.error = "not a member of this run";
      (void)co_await write_frame(*s, f);
      s->reset();
      co_return;
    }
  }
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
    if (req.value().manifest && impl_->blob_source) {
      // A lazy donor: ask for the current state; an unchanged epoch and size reuses the snapshot.
      auto got = co_await with_timeout(call_source(impl_->blob_source), kSourceWait, "blob source");
      auto cur = impl_->snapshot;
      if (!got) {
        logger("averaging")->info("state source: {}", got.error().message());
      } else if (!cur || cur->manifest.schema_hash != blob_kind() ||
                 cur->manifest.epoch != got.value().epoch ||
                 cur->manifest.size != got.value().data.size()) {
        auto& b = got.value();
        auto ins = co_await install_snapshot(b.epoch, std::move(b.data), std::move(b.metadata),
                                             blob_kind(), cfg_.blob_part_bytes);
        if (!ins) logger("averaging")->warn("state snapshot: {}", ins.error().message());
      }
    }
    auto snap = impl_->snapshot;  // keeps this snapshot alive while serving it
    if (!req.value().manifest && snap && snap->manifest.snapshot != req.value().snapshot)
      snap = given && given->manifest.snapshot == req.value().snapshot ? given : impl_->previous;
    if (req.value().manifest) given = snap;
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
      const std::size_t ps = snap->manifest.part_size;
      for (auto p : req.value().parts) {
        if (p >= snap->manifest.part_hashes.size()) {
          StateFrame f;
          f.error = "part out of range";
          w = co_await write_frame(*s, f);
          break;
        }
        const std::size_t b = std::size_t{p} * ps;
        auto data = BytesView(snap->data).subspan(b, std::min(ps, snap->data.size() - b));
        StateFrame f;
        f.part = p;
        f.payload_len = data.size();
        w = co_await write_frame(*s, f, data);
        if (!w) break;
        impl_->state_bytes_served += data.size();
      }
    }
    if (!w) break;
  }
  s->reset();
}

awaitable<result<std::vector<StateAnnouncement>>> Averager::announcements(const Bytes& kind) {
  auto self = shared_from_this();
  const PeerKey me(host_->local_peer().bytes());
  auto got = co_await directory_->get(state_key());
  if (!got) co_return got.error().with_context("load_state: reading announcements");
  std::vector<StateAnnouncement> anns;
  for (const auto& v : got.value()) {
    auto a = wire::decode_announcement(v);
    if (!a || a.value().schema_hash != kind || a.value().donor.peer == me ||
        a.value().expires <= WallClock::now())
      continue;
    if (cfg_.gate) {  // a private run: members' announcements only
      auto id = net::PeerId::from_bytes(a.value().donor.peer.bytes());
      bool admitted = false;
      if (id) admitted = co_await cfg_.gate->admit(id.value());
      if (!admitted) continue;
    }
    anns.push_back(std::move(a).value());
  }
  if (anns.empty())
    co_return make_error(errc::not_found, "load_state: nobody announces a state for " +
                                              cfg_.key.prefix + " of this kind");
  std::sort(anns.begin(), anns.end(),
            [](const auto& x, const auto& y) { return x.epoch > y.epoch; });
  co_return anns;
}

std::uint64_t lower_median(std::vector<std::uint64_t> epochs) {
  if (epochs.empty()) return 0;
  auto mid = epochs.begin() + static_cast<std::ptrdiff_t>((epochs.size() - 1) / 2);
  std::nth_element(epochs.begin(), mid, epochs.end());
  return *mid;
}

awaitable<result<StateInfo>> Averager::load_state(LoadStateOptions opts) {
  auto self = shared_from_this();
  ST_CO_TRY(have_tensors(tensors_, schema_));
  const std::uint64_t bytes = schema_.numel() * sizeof(float);
  opts.max_bytes = bytes;
  const Bytes kind = schema_hash_;
  auto blob = co_await load_kind(kind, bytes, opts);
  if (!blob) co_return blob.error();
  std::vector<float> flat(schema_.numel());
  if (bytes > 0) std::memcpy(flat.data(), blob.value().data.data(), bytes);
  scatter_flat(tensors_, 0, flat);
  co_return std::move(blob.value().info);
}

awaitable<result<BlobState>> Averager::load_blob(LoadStateOptions opts) {
  auto self = shared_from_this();
  const Bytes& kind = blob_kind();  // a function-local static: valid across co_await
  const std::uint64_t any_size = 0;
  co_return co_await load_kind(kind, any_size, opts);
}

awaitable<result<BlobState>> Averager::load_kind(Bytes kind, std::uint64_t size,
                                                 LoadStateOptions opts) {
  auto self = shared_from_this();
  if (!impl_->started) start();
  const TimePoint t0 = Clock::now();
  const TimePoint deadline = t0 + opts.timeout;
  opts.max_donors = std::max<std::size_t>(1, opts.max_donors);
  opts.parts_per_request = std::clamp<std::size_t>(opts.parts_per_request, 1, 64);

  // 1. Who announces a state of this kind (none far ahead of the others' epochs).
  ST_CO_TRY(auto all, co_await announcements(kind));
  std::vector<std::uint64_t> epochs;
  for (const auto& a : all) epochs.push_back(a.epoch);
  const std::uint64_t median = lower_median(std::move(epochs));
  std::set<PeerKey> refused;
  for (const auto& a : all)
    if (a.epoch > median && a.epoch - median > opts.max_epoch_lead) {
      logger("averaging")
          ->warn("load_state: {} announces epoch {}, more than {} ahead of the median {}: refused",
                 a.donor.peer.short_hex(), a.epoch, opts.max_epoch_lead, median);
      refused.insert(a.donor.peer);
    }

  // 2-4. Manifests, the best snapshot, parts from several donors (state_download.cpp); a
  // snapshot the caller's check refuses is dropped with its donors and the others are tried.
  const std::size_t attempts = opts.verify ? std::max<std::size_t>(1, opts.max_verify_attempts) : 1;
  for (std::size_t attempt = 0;; ++attempt) {
    std::vector<StateAnnouncement> anns;
    for (const auto& a : all)
      if (!refused.contains(a.donor.peer)) anns.push_back(a);
    if (anns.empty())
      co_return make_error(errc::unavailable, "load_state: every donor was refused");
    if (anns.size() > 2 * opts.max_donors) anns.resize(2 * opts.max_donors);
    // Member by member: GCC 12 miscompiles braced initialisers in coroutines.
    detail::StateDownload::Target target;
    target.kind = kind;
    if (size > 0) target.size = size;
    target.max_bytes = opts.max_bytes;
    target.protocol = impl_->state_protocol;
    auto dl = std::make_shared<detail::StateDownload>(*host_, *pool_, add_addresses_,
                                                      std::move(target), opts, deadline);
    auto info = co_await dl->run(std::move(anns));
    if (!info) co_return info.error();
    BlobState out;
    out.data = std::move(dl->data());
    if (opts.verify) {
      // On the pool, bounded by the load's deadline (state_verify.cpp).
      auto v = co_await detail::verify_on_pool(*pool_, opts.verify, dl->manifest(),
                                               std::move(out.data), deadline);
      if (!v) co_return v.error().with_context("load_state: checking the downloaded state");
      const auto& ok = v.value().check;
      if (!ok) {
        logger("averaging")
            ->warn("load_state: the snapshot of epoch {} from {} donor(s) failed the check: {}",
                   dl->manifest().epoch, dl->chosen_donors().size(), ok.error().message());
        for (const auto& p : dl->chosen_donors()) refused.insert(p);
        if (attempt + 1 >= attempts)
          co_return ok.error().with_context("load_state: no snapshot passed the check");
        continue;
      }
      out.data = std::move(v.value().data);
    }
    out.info = std::move(info).value();
    out.info.time = Clock::now() - t0;
    co_return out;
  }
}

}  // namespace starling::averaging
