// Peer IDs: spec vectors, string/binary round trips, CIDv1, and every rejection path.
#include <gtest/gtest.h>

#include <unordered_set>

#include "starling/core/base58.hpp"
#include "starling/net/peer_id.hpp"

using namespace starling;
using namespace starling::net;

namespace {

// libp2p/specs peer-ids/peer-ids.md test vector (Ed25519 public key protobuf).
constexpr const char* kSpecEd25519Public =
    "080112201ed1e8fae2c4a144b8be8fd4b47bf3d3b34b871c3cacf6010f0e42d474fce27e";
// base58btc of 0x00 0x24 || the protobuf above (computed independently with a Python big-int
// base58 encoder; it also matches rust-libp2p's value for this key).
constexpr const char* kSpecEd25519PeerId = "12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3pq";
// The spec's example sha2-256 peer id and its CIDv1 form (base32 of 0x01 0x72 || multihash,
// computed independently with Python's base64.b32encode).
constexpr const char* kSpecShaPeerId = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N";
constexpr const char* kSpecShaCid = "bafzbeie5745rpv2m6tjyuugywy4d5ewrqgqqhfnf445he3omzpjbx5xqxe";

Bytes hex(std::string_view s) {
  return from_hex(s).value();
}

void expect_reject(std::string_view s, const char* why, const char* needle = nullptr) {
  auto r = PeerId::from_string(s);
  ASSERT_FALSE(r) << why;
  EXPECT_EQ(r.error(), errc::invalid_argument) << why << ": " << r.error().message();
  if (needle) {
    EXPECT_NE(r.error().message().find(needle), std::string::npos)
        << why << ": " << r.error().message();
  }
}

}  // namespace

TEST(PeerId, SpecEd25519Vector) {
  auto key = crypto::PublicKey::from_protobuf(hex(kSpecEd25519Public)).value();
  auto id = PeerId::from_public_key(key);
  ASSERT_TRUE(id.valid());
  EXPECT_EQ(to_hex(id.bytes()), std::string("0024") + kSpecEd25519Public);
  EXPECT_EQ(id.to_string(), kSpecEd25519PeerId);
  auto parsed = PeerId::from_string(kSpecEd25519PeerId);
  ASSERT_TRUE(parsed) << parsed.error().message();
  EXPECT_EQ(parsed.value(), id);
  auto pk = parsed.value().public_key();
  ASSERT_TRUE(pk.has_value());
  EXPECT_EQ(*pk, key);
}

TEST(PeerId, GeneratedKeysLookLikeLibp2p) {
  for (int i = 0; i < 20; ++i) {
    auto kp = crypto::KeyPair::generate();
    auto id = PeerId::from_public_key(kp.public_key());
    auto s = id.to_string();
    EXPECT_TRUE(s.starts_with("12D3KooW")) << s;
    EXPECT_EQ(PeerId::from_string(s).value(), id);
    EXPECT_EQ(PeerId::from_bytes(id.bytes()).value(), id);
    EXPECT_EQ(id.public_key().value(), kp.public_key());
  }
}

TEST(PeerId, Sha256ForLargeKeysAndCid) {
  // A (fake) 300-byte RSA key: protobuf > 42 bytes -> sha2-256 multihash of the protobuf.
  crypto::PublicKey big(crypto::KeyType::rsa, Bytes(300, 0xab));
  auto id = PeerId::from_public_key(big);
  auto digest = crypto::sha256(big.to_protobuf());
  Bytes expected{0x12, 0x20};
  expected.insert(expected.end(), digest.begin(), digest.end());
  EXPECT_EQ(copy_bytes(id.bytes()), expected);
  EXPECT_TRUE(id.to_string().starts_with("Qm"));
  EXPECT_FALSE(id.public_key().has_value());

  auto qm = PeerId::from_string(kSpecShaPeerId);
  ASSERT_TRUE(qm) << qm.error().message();
  EXPECT_EQ(qm.value().to_string(), kSpecShaPeerId);
  auto cid = PeerId::from_string(kSpecShaCid);
  ASSERT_TRUE(cid) << cid.error().message();
  EXPECT_EQ(cid.value(), qm.value());
  // multibase base58btc ('z') CIDv1 of the same multihash.
  Bytes cid_bytes{0x01, 0x72};
  cid_bytes.insert(cid_bytes.end(), qm.value().bytes().begin(), qm.value().bytes().end());
  auto z = PeerId::from_string("z" + base58_encode(cid_bytes));
  ASSERT_TRUE(z) << z.error().message();
  EXPECT_EQ(z.value(), qm.value());
}

TEST(PeerId, CidOfEd25519Key) {
  auto id = PeerId::from_string(kSpecEd25519PeerId).value();
  Bytes cid{0x01, 0x72};
  cid.insert(cid.end(), id.bytes().begin(), id.bytes().end());
  auto parsed = PeerId::from_string("b" + base32_encode(cid));
  ASSERT_TRUE(parsed) << parsed.error().message();
  EXPECT_EQ(parsed.value(), id);
}

TEST(PeerId, StringRejections) {
  expect_reject("", "empty");
  expect_reject("12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3p0", "bad base58 char '0'",
                "base58");
  expect_reject("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5l", "bad base58 char 'l'", "base58");
  expect_reject("12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3p", "truncated");
  expect_reject("12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3pqq", "extra char");
  expect_reject("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5", "short sha256");
  expect_reject("hello", "unknown encoding", "encoding");
  expect_reject(std::string(200, '1'), "too long", "too long");
  // CID errors: wrong version, wrong codec, bad base32.
  auto qm = PeerId::from_string(kSpecShaPeerId).value();
  auto cid_with = [&](std::uint8_t version, std::uint8_t codec) {
    Bytes c{version, codec};
    c.insert(c.end(), qm.bytes().begin(), qm.bytes().end());
    return "b" + base32_encode(c);
  };
  expect_reject(cid_with(0x02, 0x72), "CID version 2", "version");
  expect_reject(cid_with(0x01, 0x70), "dag-pb codec", "codec");
  expect_reject("bAFZBEIE5745RPV2M6TJYUUGYWY4D5EWRQGQQHFNF445HE3OMZPJBX5XQXE", "upper base32",
                "base32");
  expect_reject("b", "empty CID", "CID version");
}

TEST(PeerId, BytesRejections) {
  auto expect_bad = [](const Bytes& b, const char* why, const char* needle) {
    auto r = PeerId::from_bytes(b);
    ASSERT_FALSE(r) << why;
    EXPECT_EQ(r.error(), errc::invalid_argument) << why;
    EXPECT_NE(r.error().message().find(needle), std::string::npos)
        << why << ": " << r.error().message();
  };
  Bytes sha(34, 0x11);
  sha[0] = 0x12;
  sha[1] = 0x20;
  EXPECT_TRUE(PeerId::from_bytes(sha));
  expect_bad({}, "empty", "empty");
  expect_bad({0x12}, "no length", "truncated");
  expect_bad({0x13, 0x20}, "sha512 code", "unsupported multihash code 0x13");
  expect_bad({0x80, 0x00, 0x00}, "non-minimal code", "non-minimal");
  Bytes wrong = sha;
  wrong[1] = 0x1f;
  wrong.pop_back();
  expect_bad(wrong, "sha256 of 31 bytes", "must be 32");
  Bytes trailing = sha;
  trailing.push_back(0);
  expect_bad(trailing, "trailing byte", "length mismatch");
  Bytes id_bad{0x00, 0x03, 0x08, 0x01, 0x12};
  expect_bad(id_bad, "identity with bad protobuf", "public key protobuf");
  Bytes id_long{0x00, 43};
  id_long.resize(45, 0x08);
  expect_bad(id_long, "identity over 42 bytes", "42");
}

TEST(PeerId, HashOrderAndShortString) {
  auto a = PeerId::from_public_key(crypto::KeyPair::generate().public_key());
  auto b = PeerId::from_public_key(crypto::KeyPair::generate().public_key());
  std::unordered_set<PeerId> set{a, b, a};
  EXPECT_EQ(set.size(), 2u);
  EXPECT_EQ(std::hash<PeerId>{}(a),
            std::hash<PeerId>{}(PeerId::from_string(a.to_string()).value()));
  EXPECT_TRUE(a < b || b < a);
  EXPECT_FALSE(PeerId().valid());
  EXPECT_EQ(PeerId().to_string(), "");
  auto s = a.to_string();
  auto sh = a.short_string();
  EXPECT_TRUE(sh.starts_with(s.substr(0, 6))) << sh;
  EXPECT_TRUE(sh.ends_with(s.substr(s.size() - 6))) << sh;
  EXPECT_LT(sh.size(), s.size());
}
