// Accusations as DHT records (acct_records.hpp).
#include "starling/averaging/acct_records.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "averaging/acct_codec.hpp"
#include "starling/averaging/schema.hpp"
#include "starling/core/log.hpp"

namespace starling::averaging::acct {

namespace {

constexpr std::uint8_t kTagDetached = 0xCD;

Hash32 hash32(BytesView b) {
  const Bytes h = blake2b_256(b);
  Hash32 out{};
  std::copy(h.begin(), h.end(), out.begin());
  return out;
}

std::size_t chunk_count(std::uint32_t floats) {
  return (static_cast<std::size_t>(floats) * sizeof(float) + kChunkBytes - 1) / kChunkBytes;
}

void put_hashes(Writer& w, const std::vector<Hash32>& hs) {
  w.u32(static_cast<std::uint32_t>(hs.size()));
  for (const auto& h : hs) w.fixed(h);
}

result<std::vector<float>> join(const std::vector<Hash32>& hashes, const std::vector<Bytes>& chunks,
                                std::uint32_t floats) {
  if (chunks.size() != hashes.size()) return make_error(errc::not_found, "detached: chunk missing");
  Bytes all;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (hash32(chunks[i]) != hashes[i])
      return make_error(errc::invalid_argument, "detached: chunk does not match its hash");
    all.insert(all.end(), chunks[i].begin(), chunks[i].end());
  }
  if (all.size() != static_cast<std::size_t>(floats) * sizeof(float))
    return make_error(errc::invalid_argument, "detached: chunks do not hold the values");
  std::vector<float> v(floats);
  if (floats > 0) std::memcpy(v.data(), all.data(), all.size());
  return v;
}

}  // namespace

Bytes accusation_key(const std::string& run_id) {
  return blake2b_256(as_bytes("starling/acct/accusations/" + run_id));
}

Bytes chunk_key(const std::string& run_id, const Hash32& chunk) {
  Bytes in = to_bytes("starling/acct/chunk/" + run_id + "/");
  in.insert(in.end(), chunk.begin(), chunk.end());
  return blake2b_256(in);
}

std::vector<Bytes> chunks_of(std::span<const float> v) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
  const std::size_t n = v.size_bytes();
  std::vector<Bytes> out;
  for (std::size_t off = 0; off < n; off += kChunkBytes)
    out.emplace_back(p + off, p + std::min(n, off + kChunkBytes));
  return out;
}

DetachedAccusation detach(const Accusation& a) {
  DetachedAccusation d;
  d.stripped = a;
  d.stripped.evidence.data.clear();
  d.stripped.evidence.data2.clear();
  d.floats1 = static_cast<std::uint32_t>(a.evidence.data.size());
  d.floats2 = static_cast<std::uint32_t>(a.evidence.data2.size());
  for (const auto& c : chunks_of(a.evidence.data)) d.chunks1.push_back(hash32(c));
  for (const auto& c : chunks_of(a.evidence.data2)) d.chunks2.push_back(hash32(c));
  return d;
}

Bytes encode(const DetachedAccusation& d) {
  Writer w;
  w.u8(kTagDetached);
  const Bytes a = encode(d.stripped);
  w.u32(static_cast<std::uint32_t>(a.size()));
  w.raw(a);
  w.u32(d.floats1);
  w.u32(d.floats2);
  put_hashes(w, d.chunks1);
  put_hashes(w, d.chunks2);
  return std::move(w.out);
}

result<DetachedAccusation> decode_detached(BytesView b) {
  Reader r(b);
  DetachedAccusation d;
  if (r.u8() != kTagDetached) return r.fail("not a detached accusation");
  const std::uint32_t n = r.u32();
  if (!r.has(n)) return r.fail("detached accusation: truncated");
  ST_TRY(d.stripped, decode_accusation(r.raw(n)));
  if (!d.stripped.evidence.data.empty() || !d.stripped.evidence.data2.empty())
    return r.fail("detached accusation: values inside");
  d.floats1 = r.u32();
  d.floats2 = r.u32();
  if (std::size_t{d.floats1} + d.floats2 > kMaxEvidenceFloats)
    return make_error(errc::too_large, "detached accusation: too many values");
  for (auto [floats, hs] : {std::pair{d.floats1, &d.chunks1}, std::pair{d.floats2, &d.chunks2}}) {
    const std::uint32_t count = r.u32();
    if (count != chunk_count(floats)) return r.fail("detached accusation: wrong chunk count");
    hs->resize(count);
    for (auto& h : *hs) r.fixed(h);
  }
  ST_TRY(r.finish("detached accusation"));
  return d;
}

result<Accusation> attach(const DetachedAccusation& d, const std::vector<Bytes>& chunks1,
                          const std::vector<Bytes>& chunks2) {
  Accusation a = d.stripped;
  ST_TRY(a.evidence.data, join(d.chunks1, chunks1, d.floats1));
  ST_TRY(a.evidence.data2, join(d.chunks2, chunks2, d.floats2));
  return a;
}

awaitable<result<void>> publish_accusation(Directory& dir, const std::string& run_id,
                                           const Accusation& a, WallTime expires) {
  Bytes value = encode(a);
  Bytes subkey(a.accuser.begin(), a.accuser.end());
  if (value.size() > kMaxAccusationRecord) {  // detached: the values in chunk records first
    const Bytes owner = subkey;
    for (const auto* v : {&a.evidence.data, &a.evidence.data2})
      for (auto& c : chunks_of(*v)) {
        Bytes key = chunk_key(run_id, hash32(c));
        Bytes sk = owner;
        ST_CO_TRY(co_await dir.put(std::move(key), std::move(sk), std::move(c), expires));
      }
    value = encode(detach(a));
    if (value.size() > kMaxAccusationRecord)
      co_return make_error(errc::too_large, "accusation record over " +
                                                std::to_string(kMaxAccusationRecord) + " bytes");
  }
  const Bytes h = blake2b_256(value);
  subkey.insert(subkey.end(), h.begin(), h.end());
  Bytes key = accusation_key(run_id);
  auto r = co_await dir.put(std::move(key), std::move(subkey), std::move(value), expires);
  co_return r;
}

namespace {

// The chunks of a detached accusation (those read already in `cache`); errors: one is missing.
awaitable<result<Accusation>> fetch(Directory& dir, const std::string& run_id,
                                    const DetachedAccusation& d, std::map<Hash32, Bytes>& cache) {
  std::vector<Bytes> got[2];
  const std::vector<Hash32>* lists[2] = {&d.chunks1, &d.chunks2};
  for (int l = 0; l < 2; ++l)
    for (const auto& h : *lists[l]) {
      auto it = cache.find(h);
      if (it == cache.end()) {
        Bytes key = chunk_key(run_id, h);
        auto values = co_await dir.get(std::move(key));
        if (!values) co_return values.error();
        for (auto& v : values.value())
          if (hash32(v) == h) {
            it = cache.emplace(h, std::move(v)).first;
            break;
          }
        if (it == cache.end()) co_return make_error(errc::not_found, "detached: chunk missing");
      }
      got[l].push_back(it->second);
    }
  co_return attach(d, got[0], got[1]);
}

bool admitted(PeerGate* gate, const PubKey& accuser) {
  if (!gate) return true;
  return gate->admits(peer_of_key(accuser));
}

// Judges one accusation read (decoded, or reassembled from its chunks).
void judge_one(result<Accusation> a, BanList& bans, TimePoint now, PeerGate* gate,
               CollectStats& st) {
  if (!a) {
    ++st.malformed;
    logger("averaging")->info("accusation record dropped: {}", a.error().message());
    return;
  }
  if (bans.seen(a.value())) return;
  if (!admitted(gate, a.value().accuser)) {
    ++st.refused;
    return;
  }
  if (bans.add_accusation(a.value(), now))
    ++st.verified;
  else
    ++st.rejected;
}

}  // namespace

awaitable<result<CollectStats>> collect_accusations(Directory& dir, const std::string& run_id,
                                                    BanList& bans, TimePoint now, PeerGate* gate) {
  Bytes key = accusation_key(run_id);
  auto values = co_await dir.get(std::move(key));
  if (!values) co_return values.error();
  CollectStats st;
  // Detached records cost fetches: at most kMaxDetachedPerRead per read and
  // kMaxDetachedPerAccuser per accuser, those of accused peers (their answers) first, the rest
  // in random order, so that records that never complete cannot keep others out for good.
  std::vector<DetachedAccusation> detached;
  for (const Bytes& v : values.value()) {
    ++st.records;
    if (v.empty() || v[0] != kTagDetached) {
      judge_one(decode_accusation(v), bans, now, gate, st);
      continue;
    }
    auto d = decode_detached(v);
    if (!d) {
      judge_one(d.error(), bans, now, gate, st);
    } else if (bans.seen(d.value().stripped)) {
      continue;  // judged already (this record, or its accuser's on the same subject)
    } else if (!admitted(gate, d.value().stripped.accuser)) {
      ++st.refused;
    } else {
      detached.push_back(std::move(d).value());
    }
  }
  std::shuffle(detached.begin(), detached.end(), std::mt19937(std::random_device{}()));
  std::stable_partition(detached.begin(), detached.end(), [&bans](const DetachedAccusation& d) {
    return bans.accused(d.stripped.accuser);
  });
  std::map<Hash32, Bytes> cache;
  std::map<PubKey, std::size_t> per_accuser;
  std::size_t fetched = 0;
  for (const auto& d : detached) {
    if (fetched >= kMaxDetachedPerRead ||
        per_accuser[d.stripped.accuser] >= kMaxDetachedPerAccuser) {
      ++st.incomplete;  // bounded work per read: a later read takes the rest
      continue;
    }
    ++fetched;
    ++per_accuser[d.stripped.accuser];
    auto a = co_await fetch(dir, run_id, d, cache);
    if (!a && a.error() != errc::invalid_argument) {
      ++st.incomplete;  // not readable yet: the next read tries again
      continue;
    }
    judge_one(std::move(a), bans, now, gate, st);
  }
  co_return st;
}

}  // namespace starling::averaging::acct
