// Membership certificates and revocation lists (auth/certificate.hpp) and the Membership
// registry (auth/membership.hpp): valid, expired, not yet valid, revoked (and re-admitted),
// signed by the wrong key, for the wrong peer, tampered; encodings and their bounds.
#include <gtest/gtest.h>

#include "starling/auth/membership.hpp"

using namespace starling;
using namespace starling::auth;

namespace {

constexpr std::uint64_t kT0 = 1'800'000'000;  // "now" in Unix seconds
constexpr std::uint64_t kDay = 86400;

struct Fixture {
  crypto::KeyPair authority = crypto::KeyPair::generate();
  crypto::KeyPair other_authority = crypto::KeyPair::generate();
  crypto::KeyPair alice = crypto::KeyPair::generate();
  crypto::KeyPair bob = crypto::KeyPair::generate();
  Key32 run = key32(authority.public_key()).value();

  static net::PeerId id(const crypto::KeyPair& k) {
    return net::PeerId::from_public_key(k.public_key());
  }
  static Key32 key(const crypto::KeyPair& k) { return key32(k.public_key()).value(); }
  Certificate cert(const crypto::KeyPair& member, std::uint64_t issued = kT0,
                   std::uint64_t expires = kT0 + kDay) const {
    return sign_certificate(authority, key(member), issued, expires).value();
  }
  RevocationList revoke(std::uint64_t seq, std::vector<Revocation> e) const {
    return sign_revocations(authority, seq, kT0, std::move(e)).value();
  }
};

Refusal check(const Fixture& f, const Certificate& c, const crypto::KeyPair& as,
              std::uint64_t now = kT0 + 60, const RevocationList* rl = nullptr) {
  return check_certificate(c, f.run, Fixture::key(as), now, rl);
}

}  // namespace

TEST(Certificate, ValidRoundTrip) {
  Fixture f;
  const auto c = f.cert(f.alice);
  const Bytes b = encode(c);
  ASSERT_EQ(b.size(), kCertificateBytes);
  auto d = decode_certificate(b);
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d.value(), c);
  EXPECT_EQ(check(f, d.value(), f.alice), Refusal::none);
  EXPECT_TRUE(verify_certificate(c, f.run, Fixture::key(f.alice), kT0 + 60, nullptr));
}

TEST(Certificate, ExpiredAndNotYetValid) {
  Fixture f;
  const auto c = f.cert(f.alice, kT0, kT0 + 100);
  EXPECT_EQ(check(f, c, f.alice, kT0 + 99), Refusal::none);
  EXPECT_EQ(check(f, c, f.alice, kT0 + 100), Refusal::expired);
  EXPECT_EQ(check(f, c, f.alice, kT0 + 5 * kDay), Refusal::expired);
  // Issued in the future: valid within the clock-skew allowance only.
  const auto later = f.cert(f.alice, kT0 + 2 * kClockSkew, kT0 + kDay);
  EXPECT_EQ(check(f, later, f.alice, kT0), Refusal::not_yet_valid);
  EXPECT_EQ(check(f, later, f.alice, kT0 + kClockSkew), Refusal::none);
  auto r = verify_certificate(c, f.run, Fixture::key(f.alice), kT0 + 200, nullptr);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), make_error_code(errc::permission));
  EXPECT_NE(r.error().message().find("expired"), std::string::npos) << r.error().message();
  EXPECT_FALSE(sign_certificate(f.authority, Fixture::key(f.alice), kT0, kT0));
}

TEST(Certificate, WrongKeyWrongPeerTampered) {
  Fixture f;
  // Signed by another authority: not this run's certificate.
  const auto foreign =
      sign_certificate(f.other_authority, Fixture::key(f.alice), kT0, kT0 + kDay).value();
  EXPECT_EQ(check(f, foreign, f.alice), Refusal::wrong_key);
  // Claims this run's key but was signed by another key.
  auto forged = foreign;
  forged.run_key = f.run;
  EXPECT_EQ(check(f, forged, f.alice), Refusal::bad_signature);
  // Alice's certificate shown by Bob.
  const auto c = f.cert(f.alice);
  EXPECT_EQ(check(f, c, f.bob), Refusal::wrong_member);
  // Every single-byte change of the encoding is refused (as malformed or by the checks).
  const Bytes b = encode(c);
  for (std::size_t i = 0; i < b.size(); ++i) {
    Bytes t = b;
    t[i] ^= 0x01;
    auto d = decode_certificate(t);
    if (!d) continue;
    const auto r = check_certificate(d.value(), f.run, Fixture::key(f.alice), kT0 + 60, nullptr);
    EXPECT_NE(r, Refusal::none) << "byte " << i;
  }
}

TEST(Certificate, MalformedEncodings) {
  Fixture f;
  const Bytes b = encode(f.cert(f.alice));
  EXPECT_FALSE(decode_certificate(BytesView(b).first(b.size() - 1)));
  Bytes longer = b;
  longer.push_back(0);
  EXPECT_FALSE(decode_certificate(longer));
  Bytes v2 = b;
  v2[4] = 2;
  auto d = decode_certificate(v2);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message().find("version"), std::string::npos);
  EXPECT_FALSE(decode_certificate(encode(f.revoke(1, {}))));  // a list is not a certificate
}

TEST(Revocations, RevokedAndReadmitted) {
  Fixture f;
  const auto c = f.cert(f.alice, kT0);
  const auto list = f.revoke(1, {{Fixture::key(f.alice), kT0 + 10}});
  EXPECT_TRUE(signature_valid(list));
  EXPECT_EQ(check(f, c, f.alice, kT0 + 60, &list), Refusal::revoked);
  EXPECT_EQ(check(f, f.cert(f.bob), f.bob, kT0 + 60, &list), Refusal::none);
  // A certificate issued after the revocation admits the member again.
  EXPECT_EQ(check(f, f.cert(f.alice, kT0 + 11), f.alice, kT0 + 60, &list), Refusal::none);
  // A list for another run does not revoke here.
  const auto foreign =
      sign_revocations(f.other_authority, 5, kT0, {{Fixture::key(f.alice), kT0 + 10}}).value();
  EXPECT_EQ(check(f, c, f.alice, kT0 + 60, &foreign), Refusal::none);
}

TEST(Revocations, EncodingSortedBoundedSigned) {
  Fixture f;
  std::vector<Revocation> e;
  for (int i = 0; i < 50; ++i) e.push_back({Fixture::key(crypto::KeyPair::generate()), kT0 + i});
  e.push_back(e[3]);  // a repeat is dropped
  const auto list = f.revoke(7, e);
  EXPECT_EQ(list.entries.size(), 50u);
  const Bytes b = encode(list);
  EXPECT_EQ(b.size(), kRevocationHeaderBytes + 50 * kRevocationEntryBytes + 64);
  auto d = decode_revocations(b);
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d.value(), list);
  EXPECT_TRUE(signature_valid(d.value()));
  for (const auto& r : e) EXPECT_NE(d.value().find(r.member), nullptr);
  // Tampering breaks the signature or the format.
  for (std::size_t i : {5u, 40u, 60u, 100u, static_cast<unsigned>(b.size() - 1)}) {
    Bytes t = b;
    t[i] ^= 0x80;
    auto x = decode_revocations(t);
    EXPECT_TRUE(!x || !signature_valid(x.value())) << "byte " << i;
  }
  // Unsorted entries, a count that does not match the size, too many entries: malformed.
  Bytes swapped = b;
  std::swap_ranges(swapped.begin() + kRevocationHeaderBytes,
                   swapped.begin() + kRevocationHeaderBytes + kRevocationEntryBytes,
                   swapped.begin() + kRevocationHeaderBytes + kRevocationEntryBytes);
  EXPECT_FALSE(decode_revocations(swapped));
  EXPECT_FALSE(decode_revocations(BytesView(b).first(b.size() - 40)));
  Bytes huge = b;
  huge[53] = 0xff;
  EXPECT_FALSE(decode_revocations(huge));
  EXPECT_FALSE(decode_revocations(BytesView(b).first(20)));
}

TEST(Membership, AdmitsOnlyVerifiedUnrevokedMembers) {
  Fixture f;
  Membership m(f.run);
  const auto alice = Fixture::id(f.alice), bob = Fixture::id(f.bob);
  EXPECT_EQ(m.status(alice, kT0), MemberStatus::unknown);
  ASSERT_TRUE(m.add_certificate(alice, encode(f.cert(f.alice, kT0, kT0 + 100)), kT0));
  EXPECT_TRUE(m.admits(alice, kT0 + 1));
  EXPECT_EQ(m.status(alice, kT0 + 100), MemberStatus::expired);
  // Bob publishing Alice's certificate, a foreign certificate, garbage: refused, not held.
  EXPECT_FALSE(m.add_certificate(bob, encode(f.cert(f.alice)), kT0));
  auto foreign = sign_certificate(f.other_authority, Fixture::key(f.bob), kT0, kT0 + kDay).value();
  EXPECT_FALSE(m.add_certificate(bob, encode(foreign), kT0));
  EXPECT_FALSE(m.add_certificate(bob, to_bytes("garbage"), kT0));
  EXPECT_EQ(m.status(bob, kT0), MemberStatus::unknown);
  // The same bytes again are not verified again.
  const auto before = m.stats();
  ASSERT_TRUE(m.add_certificate(alice, encode(f.cert(f.alice, kT0, kT0 + 100)), kT0));
  EXPECT_EQ(m.stats().cache_hits, before.cache_hits + 1);
  EXPECT_EQ(m.stats().verified, before.verified);

  // Revocation: newest sequence wins; older or forged lists change nothing.
  ASSERT_TRUE(m.add_certificate(bob, encode(f.cert(f.bob)), kT0));
  EXPECT_TRUE(m.admits(bob, kT0 + 1));
  auto installed = m.update_revocations(encode(f.revoke(2, {{Fixture::key(f.bob), kT0}})));
  ASSERT_TRUE(installed && installed.value());
  EXPECT_EQ(m.status(bob, kT0 + 1), MemberStatus::revoked);
  EXPECT_TRUE(m.admits(alice, kT0 + 1));
  auto older = m.update_revocations(encode(f.revoke(1, {})));
  ASSERT_TRUE(older);
  EXPECT_FALSE(older.value());
  auto forged = f.revoke(3, {});
  forged.signature[0] ^= 1;
  EXPECT_FALSE(m.update_revocations(encode(forged)));
  EXPECT_FALSE(
      m.update_revocations(encode(sign_revocations(f.other_authority, 9, kT0, {}).value())));
  EXPECT_EQ(m.revocation_sequence(), 2u);
  EXPECT_EQ(m.status(bob, kT0 + 1), MemberStatus::revoked);
  // Re-admitted with a newer certificate.
  ASSERT_TRUE(m.add_certificate(bob, encode(f.cert(f.bob, kT0 + 1)), kT0 + 1));
  EXPECT_TRUE(m.admits(bob, kT0 + 2));
}
