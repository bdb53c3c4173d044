// Membership certificates and revocation lists: encodings, signatures, checks
// (certificate.hpp has the formats).
#include "starling/auth/certificate.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace starling::auth {
namespace {

constexpr char kCertMagic[4] = {'S', 'R', 'M', 'C'};
constexpr char kListMagic[4] = {'S', 'R', 'R', 'L'};
constexpr std::uint8_t kVersion = 1;
// The domain tags include their terminating zero, so no tag is a prefix of another.
constexpr char kCertDomain[] = "starling/run-membership/v1";
constexpr char kListDomain[] = "starling/run-revocations/v1";

template <std::size_t N>
void put(Bytes& out, const std::array<std::uint8_t, N>& a) {
  out.insert(out.end(), a.begin(), a.end());
}
template <std::size_t N>
void get(std::array<std::uint8_t, N>& a, const std::uint8_t* p) {
  std::memcpy(a.data(), p, N);
}

Bytes with_domain(const char* domain, std::size_t domain_size, BytesView body) {
  Bytes m(reinterpret_cast<const std::uint8_t*>(domain),
          reinterpret_cast<const std::uint8_t*>(domain) + domain_size);
  m.insert(m.end(), body.begin(), body.end());
  return m;
}
Bytes cert_message(BytesView body) {
  return with_domain(kCertDomain, sizeof(kCertDomain), body);
}
Bytes list_message(BytesView body) {
  return with_domain(kListDomain, sizeof(kListDomain), body);
}

Bytes cert_body(const Certificate& c) {
  Bytes out(kCertMagic, kCertMagic + 4);
  out.push_back(kVersion);
  put(out, c.run_key);
  put(out, c.member);
  append_be64(out, c.issued_at);
  append_be64(out, c.expires_at);
  return out;
}

Bytes list_body(const RevocationList& l) {
  Bytes out(kListMagic, kListMagic + 4);
  out.push_back(kVersion);
  put(out, l.run_key);
  append_be64(out, l.sequence);
  append_be64(out, l.issued_at);
  append_be32(out, static_cast<std::uint32_t>(l.entries.size()));
  for (const auto& e : l.entries) {
    put(out, e.member);
    append_be64(out, e.revoked_at);
  }
  return out;
}

Error bad(const std::string& what) {
  return make_error(errc::invalid_argument, what);
}

std::string short_key(const Key32& k) {
  return to_hex(BytesView(k.data(), 6));
}

}  // namespace

const Revocation* RevocationList::find(const Key32& member) const {
  auto it = std::lower_bound(entries.begin(), entries.end(), member,
                             [](const Revocation& r, const Key32& k) { return r.member < k; });
  return it != entries.end() && it->member == member ? &*it : nullptr;
}

const char* refusal_name(Refusal r) {
  switch (r) {
    case Refusal::none:
      return "member";
    case Refusal::wrong_key:
      return "wrong run key";
    case Refusal::bad_signature:
      return "bad signature";
    case Refusal::wrong_member:
      return "wrong member";
    case Refusal::expired:
      return "expired";
    case Refusal::not_yet_valid:
      return "not yet valid";
    case Refusal::revoked:
      return "revoked";
  }
  return "?";
}

result<Key32> key32(const crypto::PublicKey& key) {
  if (key.type() != crypto::KeyType::ed25519 || key.data().size() != 32)
    return bad("not an Ed25519 public key");
  Key32 k;
  get(k, key.data().data());
  return k;
}

result<Key32> member_key(const net::PeerId& peer) {
  auto pk = peer.public_key();
  if (!pk) return bad("peer id " + peer.short_string() + " does not inline its public key");
  return key32(*pk);
}

crypto::PublicKey public_key(const Key32& k) {
  return crypto::PublicKey(crypto::KeyType::ed25519, Bytes(k.begin(), k.end()));
}

Bytes encode(const Certificate& c) {
  Bytes out = cert_body(c);
  put(out, c.signature);
  return out;
}

Bytes encode(const RevocationList& l) {
  Bytes out = list_body(l);
  put(out, l.signature);
  return out;
}

result<Certificate> decode_certificate(BytesView in) {
  if (in.size() != kCertificateBytes)
    return bad("membership certificate of " + std::to_string(in.size()) + " bytes (expected " +
               std::to_string(kCertificateBytes) + ")");
  if (std::memcmp(in.data(), kCertMagic, 4) != 0) return bad("not a membership certificate");
  if (in[4] != kVersion)
    return bad("membership certificate version " + std::to_string(in[4]) + " (expected 1)");
  const std::uint8_t* p = in.data() + 5;
  Certificate c;
  get(c.run_key, p);
  get(c.member, p + 32);
  c.issued_at = load_be64(p + 64);
  c.expires_at = load_be64(p + 72);
  get(c.signature, p + 80);
  return c;
}

result<RevocationList> decode_revocations(BytesView in) {
  if (in.size() < kRevocationHeaderBytes + 64) return bad("revocation list truncated");
  if (std::memcmp(in.data(), kListMagic, 4) != 0) return bad("not a revocation list");
  if (in[4] != kVersion)
    return bad("revocation list version " + std::to_string(in[4]) + " (expected 1)");
  const std::uint8_t* p = in.data() + 5;
  RevocationList l;
  get(l.run_key, p);
  l.sequence = load_be64(p + 32);
  l.issued_at = load_be64(p + 40);
  const std::uint32_t n = load_be32(p + 48);
  if (n > kMaxRevocations)
    return bad("revocation list of " + std::to_string(n) + " entries (max " +
               std::to_string(kMaxRevocations) + ")");
  if (in.size() != kRevocationHeaderBytes + std::size_t{n} * kRevocationEntryBytes + 64)
    return bad("revocation list of " + std::to_string(in.size()) + " bytes for " +
               std::to_string(n) + " entries");
  p = in.data() + kRevocationHeaderBytes;
  l.entries.resize(n);
  for (std::uint32_t i = 0; i < n; ++i, p += kRevocationEntryBytes) {
    get(l.entries[i].member, p);
    l.entries[i].revoked_at = load_be64(p + 32);
    if (i > 0 && !(l.entries[i - 1].member < l.entries[i].member))
      return bad("revocation list entries not sorted or repeated");
  }
  get(l.signature, p);
  return l;
}

result<Certificate> sign_certificate(const crypto::KeyPair& run_key, const Key32& member,
                                     std::uint64_t issued_at, std::uint64_t expires_at) {
  if (issued_at >= expires_at) return bad("a certificate must expire after it is issued");
  Certificate c;
  ST_TRY(c.run_key, key32(run_key.public_key()));
  c.member = member;
  c.issued_at = issued_at;
  c.expires_at = expires_at;
  const Bytes sig = run_key.sign(cert_message(cert_body(c)));
  get(c.signature, sig.data());
  return c;
}

result<RevocationList> sign_revocations(const crypto::KeyPair& run_key, std::uint64_t sequence,
                                        std::uint64_t issued_at, std::vector<Revocation> entries) {
  std::sort(entries.begin(), entries.end(), [](const Revocation& a, const Revocation& b) {
    return a.member != b.member ? a.member < b.member : a.revoked_at > b.revoked_at;
  });
  entries.erase(
      std::unique(entries.begin(), entries.end(),
                  [](const Revocation& a, const Revocation& b) { return a.member == b.member; }),
      entries.end());
  if (entries.size() > kMaxRevocations)
    return bad("more than " + std::to_string(kMaxRevocations) + " revocations");
  RevocationList l;
  ST_TRY(l.run_key, key32(run_key.public_key()));
  l.sequence = sequence;
  l.issued_at = issued_at;
  l.entries = std::move(entries);
  const Bytes sig = run_key.sign(list_message(list_body(l)));
  get(l.signature, sig.data());
  return l;
}

bool signature_valid(const Certificate& c) {
  return public_key(c.run_key).verify(cert_message(cert_body(c)),
                                      BytesView(c.signature.data(), c.signature.size()));
}

bool signature_valid(const RevocationList& l) {
  return public_key(l.run_key).verify(list_message(list_body(l)),
                                      BytesView(l.signature.data(), l.signature.size()));
}

Refusal check_certificate(const Certificate& c, const Key32& run_key, const Key32& member,
                          std::uint64_t now, const RevocationList* revocations) {
  if (c.run_key != run_key) return Refusal::wrong_key;
  if (c.member != member) return Refusal::wrong_member;
  if (!signature_valid(c)) return Refusal::bad_signature;
  return check_validity(c, now, revocations);
}

Refusal check_validity(const Certificate& c, std::uint64_t now, const RevocationList* revocations) {
  if (now >= c.expires_at) return Refusal::expired;
  if (now + kClockSkew < c.issued_at) return Refusal::not_yet_valid;
  if (revocations && revocations->run_key == c.run_key)
    if (const Revocation* r = revocations->find(c.member); r && r->revoked_at >= c.issued_at)
      return Refusal::revoked;
  return Refusal::none;
}

result<void> verify_certificate(const Certificate& c, const Key32& run_key, const Key32& member,
                                std::uint64_t now, const RevocationList* revocations) {
  const Refusal r = check_certificate(c, run_key, member, now, revocations);
  if (r == Refusal::none) return success();
  return make_error(errc::permission, std::string(refusal_name(r)) + ": certificate of member " +
                                          short_key(c.member) + " for run key " +
                                          short_key(c.run_key));
}

std::string format_run_key(const Key32& k) {
  return net::PeerId::from_public_key(public_key(k)).to_string();
}

result<Key32> parse_run_key(std::string_view s) {
  if (s.size() == 64) {
    ST_TRY(auto b, from_hex(s));
    Key32 k;
    get(k, b.data());
    return k;
  }
  auto id = net::PeerId::from_string(s);
  if (!id) return id.error().with_context("run key");
  return member_key(id.value());
}

std::uint64_t unix_seconds(WallTime t) {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
  return s < 0 ? 0 : static_cast<std::uint64_t>(s);
}

}  // namespace starling::auth
