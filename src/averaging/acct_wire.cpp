// Canonical encodings, hashes and signatures of the accountability statements
// (accountability.hpp).
#include <openssl/evp.h>
#include <sodium.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>

#include "averaging/acct_codec.hpp"
#include "starling/averaging/accountability.hpp"

namespace starling::averaging::acct {

namespace {

constexpr std::uint8_t kTagCommitment = 0xC1;
constexpr std::uint8_t kTagReceipt = 0xC2;
constexpr std::uint8_t kTagReveal = 0xC3;
constexpr std::uint8_t kTagReport = 0xC4;

Hash32 blake(std::initializer_list<BytesView> parts) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, 32);
  for (auto p : parts) crypto_generichash_update(&st, p.data(), p.size());
  Hash32 out{};
  crypto_generichash_final(&st, out.data(), out.size());
  return out;
}

// The bytes a signature covers: a per-type domain tag, then the encoding without the signature.
Bytes signed_bytes(std::string_view domain, const Bytes& enc) {
  Bytes out(domain.begin(), domain.end());
  out.push_back(0);
  out.insert(out.end(), enc.begin(), enc.end() - 64);
  return out;
}

template <class T>
void sign_with(T& s, const crypto::KeyPair& k, std::string_view domain) {
  s.key = key_of(k);
  const Bytes sig = k.sign(signed_bytes(domain, encode(s)));
  std::copy(sig.begin(), sig.end(), s.sig.begin());
}

template <class T>
bool verify_with(const T& s, std::string_view domain) {
  const crypto::PublicKey pk(crypto::KeyType::ed25519, Bytes(s.key.begin(), s.key.end()));
  return pk.verify(signed_bytes(domain, encode(s)), BytesView(s.sig.data(), s.sig.size()));
}

constexpr std::string_view kDomCommitment = "starling/acct/commitment/1";
constexpr std::string_view kDomReceipt = "starling/acct/receipt/1";
constexpr std::string_view kDomReveal = "starling/acct/reveal/1";
constexpr std::string_view kDomReport = "starling/acct/report/1";

}  // namespace

Hash32 round_id(const RoundInfo& info) {
  Writer w;
  w.u32(static_cast<std::uint32_t>(info.context.size()));
  w.raw(info.context);
  w.u32(static_cast<std::uint32_t>(info.members.size()));
  for (const auto& k : info.members) w.fixed(k);
  return blake({as_bytes("starling/acct/round/1"), w.out});
}

// SHA-256 through OpenSSL: about four times BLAKE2b's speed where the CPU has SHA
// instructions (docs/benchmarks.md), and the bulk of the accountability work is this hash.
Hash32 hash_floats(std::span<const float> v) {
  static_assert(std::endian::native == std::endian::little, "little-endian hosts only");
  Hash32 out{};
  unsigned int len = 0;
  if (EVP_Digest(v.data(), v.size_bytes(), out.data(), &len, EVP_sha256(), nullptr) != 1 ||
      len != out.size())
    throw std::runtime_error("SHA-256 failed");
  return out;
}

Hash32 hash_nonce(const Hash32& nonce) {
  return blake({as_bytes("starling/acct/nonce/1"), BytesView(nonce.data(), nonce.size())});
}

Hash32 round_seed(const Hash32& round, std::span<const Hash32> nonces) {
  Writer w;
  w.fixed(round);
  for (const auto& n : nonces) w.fixed(n);
  return blake({as_bytes("starling/acct/seed/1"), w.out});
}

PubKey key_of(const crypto::KeyPair& k) {
  PubKey p{};
  const Bytes& d = k.public_key().data();
  std::copy_n(d.begin(), std::min(d.size(), p.size()), p.begin());
  return p;
}

std::optional<PubKey> key_of_peer(const net::PeerId& id) {
  auto k = id.public_key();
  if (!k || k->type() != crypto::KeyType::ed25519 || k->data().size() != 32) return std::nullopt;
  PubKey out{};
  std::copy(k->data().begin(), k->data().end(), out.begin());
  return out;
}

net::PeerId peer_of_key(const PubKey& k) {
  return net::PeerId::from_public_key(
      crypto::PublicKey(crypto::KeyType::ed25519, Bytes(k.begin(), k.end())));
}

// --- encodings ---

Bytes encode(const Commitment& s) {
  Writer w;
  w.u8(kTagCommitment);
  w.fixed(s.round);
  w.u32(s.subround);
  w.u32(s.sender);
  w.fixed(s.key);
  w.f64(s.weight);
  w.fixed(s.nonce_hash);
  w.u32(static_cast<std::uint32_t>(s.parts.size()));
  for (const auto& h : s.parts) w.fixed(h);
  w.fixed(s.sig);
  return std::move(w.out);
}

result<Commitment> decode_commitment(BytesView b) {
  Reader r(b);
  Commitment s;
  if (r.u8() != kTagCommitment) return r.fail("not a commitment");
  r.fixed(s.round);
  s.subround = r.u32();
  s.sender = r.u32();
  r.fixed(s.key);
  s.weight = r.f64();
  r.fixed(s.nonce_hash);
  const std::uint32_t n = r.u32();
  if (n > kMaxCommittedParts) return make_error(errc::too_large, "commitment: too many parts");
  if (!r.has(std::size_t{n} * 32)) return r.fail("commitment: truncated parts");
  s.parts.resize(n);
  for (auto& h : s.parts) r.fixed(h);
  r.fixed(s.sig);
  ST_TRY(r.finish("commitment"));
  if (!std::isfinite(s.weight) || s.weight < 0) return r.fail("commitment: bad weight");
  return s;
}

Bytes encode(const DataReceipt& s) {
  Writer w;
  w.u8(kTagReceipt);
  w.u8(static_cast<std::uint8_t>(s.kind));
  w.fixed(s.round);
  w.u32(s.subround);
  w.u32(s.part);
  w.u32(s.signer);
  w.fixed(s.key);
  w.fixed(s.data_hash);
  w.f64(s.weight);
  w.u8(s.clip ? 1 : 0);
  w.f64(s.tau);
  w.f64(s.norm);
  w.u32(static_cast<std::uint32_t>(s.counted.size()));
  for (auto m : s.counted) w.u32(m);
  w.fixed(s.sig);
  return std::move(w.out);
}

result<DataReceipt> decode_receipt(BytesView b) {
  Reader r(b);
  DataReceipt s;
  if (r.u8() != kTagReceipt) return r.fail("not a receipt");
  const std::uint8_t kind = r.u8();
  if (kind != 1 && kind != 2) return r.fail("receipt: unknown kind");
  s.kind = static_cast<DataKind>(kind);
  r.fixed(s.round);
  s.subround = r.u32();
  s.part = r.u32();
  s.signer = r.u32();
  r.fixed(s.key);
  r.fixed(s.data_hash);
  s.weight = r.f64();
  const std::uint8_t clip = r.u8();
  if (clip > 1) return r.fail("receipt: bad aggregation flag");
  s.clip = clip == 1;
  s.tau = r.f64();
  s.norm = r.f64();
  const std::uint32_t n = r.u32();
  if (n > kMaxMembers) return make_error(errc::too_large, "receipt: too many counted members");
  if (!r.has(std::size_t{n} * 4)) return r.fail("receipt: truncated counted set");
  s.counted.resize(n);
  for (auto& m : s.counted) m = r.u32();
  r.fixed(s.sig);
  ST_TRY(r.finish("receipt"));
  for (double x : {s.weight, s.tau, s.norm})
    if (!std::isfinite(x) || x < 0) return r.fail("receipt: bad weight, tau or norm");
  for (std::size_t i = 0; i < s.counted.size(); ++i) {
    if (s.counted[i] >= kMaxMembers || (i > 0 && s.counted[i] <= s.counted[i - 1]))
      return r.fail("receipt: counted set not ascending");
  }
  return s;
}

Bytes encode(const Reveal& s) {
  Writer w;
  w.u8(kTagReveal);
  w.fixed(s.round);
  w.u32(s.member);
  w.fixed(s.key);
  w.fixed(s.nonce);
  w.fixed(s.sig);
  return std::move(w.out);
}

result<Reveal> decode_reveal(BytesView b) {
  Reader r(b);
  Reveal s;
  if (r.u8() != kTagReveal) return r.fail("not a reveal");
  r.fixed(s.round);
  s.member = r.u32();
  r.fixed(s.key);
  r.fixed(s.nonce);
  r.fixed(s.sig);
  ST_TRY(r.finish("reveal"));
  return s;
}

Bytes encode(const ProjectionReport& s) {
  Writer w;
  w.u8(kTagReport);
  w.fixed(s.round);
  w.u32(s.subround);
  w.u32(s.part);
  w.u32(s.member);
  w.fixed(s.key);
  w.fixed(s.seed);
  w.fixed(s.result_hash);
  w.f64(s.weight);
  w.f64(s.proj);
  w.f64(s.dist);
  w.fixed(s.sig);
  return std::move(w.out);
}

result<ProjectionReport> decode_report(BytesView b) {
  Reader r(b);
  ProjectionReport s;
  if (r.u8() != kTagReport) return r.fail("not a projection report");
  r.fixed(s.round);
  s.subround = r.u32();
  s.part = r.u32();
  s.member = r.u32();
  r.fixed(s.key);
  r.fixed(s.seed);
  r.fixed(s.result_hash);
  s.weight = r.f64();
  s.proj = r.f64();
  s.dist = r.f64();
  r.fixed(s.sig);
  ST_TRY(r.finish("projection report"));
  if (!std::isfinite(s.weight) || s.weight < 0 || !std::isfinite(s.proj) ||
      !std::isfinite(s.dist) || s.dist < 0)
    return r.fail("projection report: bad number");
  return s;
}

// --- signatures ---

void sign(Commitment& s, const crypto::KeyPair& k) {
  sign_with(s, k, kDomCommitment);
}
void sign(DataReceipt& s, const crypto::KeyPair& k) {
  sign_with(s, k, kDomReceipt);
}
void sign(Reveal& s, const crypto::KeyPair& k) {
  sign_with(s, k, kDomReveal);
}
void sign(ProjectionReport& s, const crypto::KeyPair& k) {
  sign_with(s, k, kDomReport);
}
bool verify_sig(const Commitment& s) {
  return verify_with(s, kDomCommitment);
}
bool verify_sig(const DataReceipt& s) {
  return verify_with(s, kDomReceipt);
}
bool verify_sig(const Reveal& s) {
  return verify_with(s, kDomReveal);
}
bool verify_sig(const ProjectionReport& s) {
  return verify_with(s, kDomReport);
}

}  // namespace starling::averaging::acct
