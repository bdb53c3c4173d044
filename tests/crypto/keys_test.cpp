// Keys: protobuf encoding against the libp2p peer-ids spec test vectors, signatures, SHA-256,
// base58/base32.
#include <gtest/gtest.h>

#include "starling/core/base58.hpp"
#include "starling/crypto/keys.hpp"

using namespace starling;
using namespace starling::crypto;

namespace {

// libp2p/specs peer-ids/peer-ids.md, "Test vectors": Ed25519 keys as protobuf hex.
constexpr const char* kSpecEd25519Private =
    "080112407e0830617c4a7de83925dfb2694556b12936c477a0e1feb2e148ec9da60fee7d1ed1e8fae2c4a144b8"
    "be8fd4b47bf3d3b34b871c3cacf6010f0e42d474fce27e";
constexpr const char* kSpecEd25519Public =
    "080112201ed1e8fae2c4a144b8be8fd4b47bf3d3b34b871c3cacf6010f0e42d474fce27e";
// The same spec's secp256k1 public key (we parse it, but cannot verify its signatures).
constexpr const char* kSpecSecp256k1Public =
    "08021221037777e994e452c21604f91de093ce415f5432f701dd8cd1a7a6fea0e630bfca99";

Bytes hex(std::string_view s) {
  return from_hex(s).value();
}

}  // namespace

TEST(Keys, SpecVectorEd25519) {
  auto kp = KeyPair::from_private_protobuf(hex(kSpecEd25519Private));
  ASSERT_TRUE(kp) << kp.error().message();
  // The seed is bytes 4..36 of the private protobuf; libsodium must derive the spec's public key.
  EXPECT_EQ(to_hex(kp.value().seed()), std::string(kSpecEd25519Private).substr(8, 64));
  EXPECT_EQ(to_hex(kp.value().public_key().to_protobuf()), kSpecEd25519Public);
  EXPECT_EQ(to_hex(kp.value().to_private_protobuf()), kSpecEd25519Private);

  auto pub = PublicKey::from_protobuf(hex(kSpecEd25519Public));
  ASSERT_TRUE(pub) << pub.error().message();
  EXPECT_EQ(pub.value().type(), KeyType::ed25519);
  EXPECT_EQ(pub.value(), kp.value().public_key());
  EXPECT_EQ(to_hex(pub.value().to_protobuf()), kSpecEd25519Public);

  auto from_seed = KeyPair::from_seed(kp.value().seed());
  ASSERT_TRUE(from_seed);
  EXPECT_EQ(from_seed.value().public_key(), pub.value());
}

TEST(Keys, SpecVectorSecp256k1PublicParses) {
  auto pub = PublicKey::from_protobuf(hex(kSpecSecp256k1Public));
  ASSERT_TRUE(pub) << pub.error().message();
  EXPECT_EQ(pub.value().type(), KeyType::secp256k1);
  EXPECT_EQ(pub.value().data().size(), 33u);
  EXPECT_EQ(to_hex(pub.value().to_protobuf()), kSpecSecp256k1Public);
  EXPECT_FALSE(pub.value().verify(as_bytes("m"), Bytes(64, 0)));  // unsupported -> false
}

TEST(Keys, SignVerify) {
  auto kp = KeyPair::generate();
  auto kp2 = KeyPair::generate();
  EXPECT_NE(kp.public_key(), kp2.public_key());
  auto msg = to_bytes("hello starling");
  auto sig = kp.sign(msg);
  ASSERT_EQ(sig.size(), 64u);
  EXPECT_TRUE(kp.public_key().verify(msg, sig));
  EXPECT_FALSE(kp2.public_key().verify(msg, sig));
  auto tampered = sig;
  tampered[10] ^= 1;
  EXPECT_FALSE(kp.public_key().verify(msg, tampered));
  auto msg2 = msg;
  msg2.back() ^= 1;
  EXPECT_FALSE(kp.public_key().verify(msg2, sig));
  EXPECT_FALSE(kp.public_key().verify(msg, BytesView(sig).first(63)));
  EXPECT_FALSE(PublicKey().verify(msg, sig));  // empty key
  // Ed25519 is deterministic: the same key signs the same message identically.
  EXPECT_EQ(kp.sign(msg), sig);
}

TEST(Keys, FromSeedRejectsWrongSize) {
  auto r = KeyPair::from_seed(Bytes(31, 1));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::invalid_argument);
  EXPECT_FALSE(KeyPair::from_seed(Bytes(33, 1)));
}

TEST(Keys, PublicProtobufRejections) {
  auto expect_reject = [](const std::string& hexpb, errc code, const char* why) {
    auto r = PublicKey::from_protobuf(hex(hexpb));
    ASSERT_FALSE(r) << why;
    EXPECT_EQ(r.error(), code) << why << ": " << r.error().message();
    EXPECT_FALSE(r.error().context().empty()) << why;
  };
  const std::string key32(64, 'a');
  expect_reject("", errc::invalid_argument, "empty");
  expect_reject("0801", errc::invalid_argument, "missing data");
  expect_reject("1220" + key32, errc::invalid_argument, "missing type");
  expect_reject("12200801", errc::invalid_argument, "data before type");
  expect_reject("08011220" + key32 + "00", errc::invalid_argument, "trailing garbage");
  expect_reject("08011220" + key32 + "0801", errc::invalid_argument, "duplicate type after data");
  expect_reject(
      "08010801"
      "1220" +
          key32,
      errc::invalid_argument, "duplicate type");
  expect_reject("08011220" + key32 + "1800", errc::invalid_argument, "unknown field 3");
  expect_reject(
      "0805"
      "1220" +
          key32,
      errc::invalid_argument, "unknown key type");
  expect_reject("08011221" + key32 + "aa", errc::invalid_argument, "ed25519 33 bytes");
  expect_reject("0801121f" + key32.substr(2), errc::invalid_argument, "ed25519 31 bytes");
  expect_reject("08011220" + key32.substr(2), errc::invalid_argument, "truncated data");
  expect_reject("0801128080", errc::invalid_argument, "truncated length varint");
  expect_reject("08811220" + key32, errc::invalid_argument, "truncated type varint");
  expect_reject(
      "088100"
      "1220" +
          key32,
      errc::invalid_argument, "non-minimal type varint");
  expect_reject("0a01011220" + key32, errc::invalid_argument, "type with wrong wire type");
  expect_reject("08011020", errc::invalid_argument, "data with wrong wire type");
  expect_reject("08001200", errc::invalid_argument, "empty rsa key");
  expect_reject("0800128080ff7f", errc::too_large, "huge data length");
}

TEST(Keys, PrivateProtobufRejectionsAndLegacyForm) {
  auto good = hex(kSpecEd25519Private);
  // Legacy 96-byte form: seed || pub || pub.
  Bytes legacy{0x08, 0x01, 0x12, 0x60};
  legacy.insert(legacy.end(), good.begin() + 4, good.end());
  legacy.insert(legacy.end(), good.end() - 32, good.end());
  auto kp = KeyPair::from_private_protobuf(legacy);
  ASSERT_TRUE(kp) << kp.error().message();
  EXPECT_EQ(to_hex(kp.value().public_key().to_protobuf()), kSpecEd25519Public);
  // Legacy form with mismatching copies.
  legacy.back() ^= 1;
  auto r = KeyPair::from_private_protobuf(legacy);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::invalid_argument);
  // Public half does not match the seed.
  auto wrong_pub = good;
  wrong_pub.back() ^= 1;
  r = KeyPair::from_private_protobuf(wrong_pub);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::invalid_argument);
  EXPECT_NE(r.error().context().find("does not match"), std::string::npos);
  // Seed only (32 bytes) is not a libp2p private key.
  Bytes seed_only{0x08, 0x01, 0x12, 0x20};
  seed_only.insert(seed_only.end(), good.begin() + 4, good.begin() + 36);
  r = KeyPair::from_private_protobuf(seed_only);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::invalid_argument);
  // Other key types are well-formed but unsupported.
  auto rsa = good;
  rsa[1] = 0x00;
  r = KeyPair::from_private_protobuf(rsa);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::unsupported);
}

TEST(Keys, Sha256KnownAnswers) {
  // FIPS 180-2 appendix B.1 and the empty-string digest.
  EXPECT_EQ(to_hex(sha256(as_bytes("abc"))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(to_hex(sha256({})), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Base58, KnownAnswersAndRoundTrip) {
  // multiformats/multibase test vectors ("yes mani !") and the Bitcoin "hello world" example.
  EXPECT_EQ(base58_encode(as_bytes("yes mani !")), "7paNL19xttacUY");
  EXPECT_EQ(base58_encode(as_bytes("hello world")), "StV1DL6CwTryKyV");
  Bytes lead{0, 0};
  auto ym = to_bytes("yes mani !");
  lead.insert(lead.end(), ym.begin(), ym.end());
  EXPECT_EQ(base58_encode(lead), "117paNL19xttacUY");
  EXPECT_EQ(base58_decode("117paNL19xttacUY").value(), lead);
  EXPECT_EQ(base58_encode({}), "");
  EXPECT_EQ(base58_decode("").value(), Bytes{});
  EXPECT_EQ(base58_encode(Bytes{0}), "1");
  for (int n = 0; n < 64; ++n) {
    Bytes b(n);
    for (int i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>(i * 37 + n);
    if (n % 3 == 0 && n > 0) b[0] = 0;
    EXPECT_EQ(base58_decode(base58_encode(b)).value(), b) << n;
  }
  for (const char* bad : {"0", "O", "I", "l", "abc+", "12 3", "\xff"}) {
    auto r = base58_decode(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error(), errc::invalid_argument);
  }
}

TEST(Base32, KnownAnswersAndRejections) {
  // RFC 4648 section 10 vectors (lower case, unpadded) and multibase "yes mani !".
  const std::pair<const char*, const char*> rfc[] = {{"", ""},
                                                     {"f", "my"},
                                                     {"fo", "mzxq"},
                                                     {"foo", "mzxw6"},
                                                     {"foob", "mzxw6yq"},
                                                     {"fooba", "mzxw6ytb"},
                                                     {"foobar", "mzxw6ytboi"},
                                                     {"yes mani !", "pfsxgidnmfxgsibb"}};
  for (auto [plain, enc] : rfc) {
    EXPECT_EQ(base32_encode(as_bytes(plain)), enc);
    EXPECT_EQ(base32_decode(enc).value(), to_bytes(plain));
  }
  for (const char* bad : {"MZXW6", "mzxw6=", "m1", "m", "mzx", "mzxw6y", "mz"}) {
    auto r = base32_decode(bad);
    EXPECT_FALSE(r) << bad;
    if (!r) {
      EXPECT_EQ(r.error(), errc::invalid_argument);
    }
  }
}
