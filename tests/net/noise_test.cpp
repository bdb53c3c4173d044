// Noise, the pure part: primitives against RFC 5869 and the published Noise test vectors
// (cacophony, snow), the XX state machine's failure rules, and the libp2p payload rules.
// The async handshake and the encrypted stream are tested in noise_stream_test.cpp.
#include <gtest/gtest.h>

#include <limits>

#include "net/noise_handshake.hpp"
#include "starling/pb/noise.pb.h"

using namespace starling;
using namespace starling::net::noise;

namespace {

Bytes hex(const char* s) {
  return from_hex(s).value();
}

X25519KeyPair x_key(const char* secret_hex) {
  return X25519KeyPair::from_secret(hex(secret_hex)).value();
}

// A published Noise_XX_25519_ChaChaPoly_SHA256 vector. Messages alternate starting with the
// initiator: 0..2 are the handshake, the rest transport messages.
struct Vector {
  const char* prologue;
  const char* init_static;
  const char* init_ephemeral;
  const char* resp_static;
  const char* resp_ephemeral;
  const char* handshake_hash;                                 // may be empty
  std::vector<std::pair<const char*, const char*>> messages;  // payload, ciphertext
};

// haskell-cryptography/cacophony vectors/cacophony.txt, entry Noise_XX_25519_ChaChaPoly_SHA256.
const Vector kCacophony{
    "4a6f686e2047616c74",
    "e61ef9919cde45dd5f82166404bd08e38bceb5dfdfded0a34c8df7ed542214d1",
    "893e28b9dc6ca8d611ab664754b8ceb7bac5117349a4439a6b0569da977c464a",
    "4a3acbfdb163dec651dfa3194dece676d437029c62a408b4c5ea9114246e4893",
    "bbdb4cdbd309f1a1f2e1456967fe288cadd6f712d65dc7b7793d5e63da6b375b",
    "c8e5f64e846193be2a834104c2a009868d6c9f3bd3c186299888b488b2f1f58e",
    {{"4c756477696720766f6e204d69736573",
      "ca35def5ae56cec33dc2036731ab14896bc4c75dbb07a61f879f8e3afa4c79444c756477696720766f6e204d"
      "69736573"},
     {"4d757272617920526f746862617264",
      "95ebc60d2b1fa672c1f46a8aa265ef51bfe38e7ccb39ec5be34069f14480884381cbad1f276e038c48378ffce2"
      "b65285e08d6b68aaa3629a5a8639392490e5b9bd5269c2f1e4f488ed8831161f19b7815528f8982ffe09be9b5c"
      "412f8a0db50f8814c7194e83f23dbd8d162c9326ad"},
     {"462e20412e20486179656b",
      "c7195ffacac1307ff99046f219750fc47693e23c3cb08b89c2af808b444850a80ae475b9df0f169ae80a89be08"
      "65b57f58c9fea0d4ec82a286427402f113e4b6ae769a1d95941d49b25030"},
     {"4361726c204d656e676572", "96763ed773f8e47bb3712f0e29b3060ffc956ffc146cee53d5e1df"},
     {"4a65616e2d426170746973746520536179",
      "3e40f15f6f3a46ae446b253bf8b1d9ffb6ed9b174d272328ff91a7e2e5c79c07f5"},
     {"457567656e2042f6686d20766f6e2042617765726b",
      "eb3f3515110702e047a6c9da4478b6ead94873c11c0f2d710ddb3f09fce024b3a58502ae3f"}}};

// mcginty/snow tests/vectors/snow.txt, entry Noise_XX_25519_ChaChaPoly_SHA256 (no psk).
const Vector kSnow{
    "5468657265206973206e6f20726967687420616e642077726f6e672e2054686572652773206f6e6c792066756e"
    "20616e6420626f72696e672e",
    "7dec208517a3b81a2861d7a71266d5d6dc944c5a8816634a86fe63198a0148ee",
    "a32daf21e93c0131495ce1d903181fde81cc46937daaeb990bae7c992709421e",
    "4d0aed5098e3b4ef20357e9f686ce66204c792b358da2e475017d6c485304881",
    "4eece0f195d026db035ff987597c429d3ad3bcc2944df37d649528951b2a27c5",
    "",
    {{"d03c489139e645d0711a3c9e810d776b46a84912463fafa87b884eebf242dc34",
      "f9fa868ba97ab8a2686deccfaad5a484ee10a5bb85e3d1dce015a84797f92818d03c489139e645d0711a3c9e81"
      "0d776b46a84912463fafa87b884eebf242dc34"},
     {"d8190a92f7dc0c93dbea9118ba8055751fb7c6590c416ffbd419964132b99a85",
      "8c4e6fdb7d09d501a86f7eca5c234522751706ed409182c05cdf5f827d4dae47b81c6c5f43b025692c24391eef"
      "ee725c17d8cb0fbe3e4abb8aedf42c4fd2592d4ea48ac08989d6ae8b4adae08b2c34087c808c7aa55a63c02b0f"
      "ab9e930612336bd43eaea04d3c670a0a146691aa9cc9d357872320dc735dbc48580cffb553db"},
     {"77891b19dcb92ef7c055b672c4a5aa7fdf1c84146b8b303459022729473ce254",
      "933ca6b5ed60df3df66121f0ab49a09e49efa45c613a86a3cecbf4c535cef2f83f72b42837b18e3572f2fdc2b7"
      "4c331e2368a545cef54bdca081678ab0e9dd5348122459e0c034c851984d88ce610963d43cde6cfe73a67fbd5a"
      "63e8bfca96d0"},
     {"d7efdf988072881941db045a42882433817555128fbf5663e56081712ec7d212",
      "54ef0ff0629e1aaa7685a2806ab111cba76b52331f2642276736f415868eacb69ab2577f3bda0cbf72f879685f"
      "6ed25f"},
     {"dd7bf01a588bafb52c6cfba952e5d8fe35cc2b3f92b4730ae2474615157345ce",
      "356be70f110306d5c699bb834bb9d58d909e325924dfbec972e406e6f294dc63e1daebefe8a62a334facc8048a"
      "b4ad66"}}};

void check_vector(const Vector& v) {
  Bytes prologue = hex(v.prologue);
  XXHandshake init(Role::initiator, x_key(v.init_static), prologue, x_key(v.init_ephemeral));
  XXHandshake resp(Role::responder, x_key(v.resp_static), prologue, x_key(v.resp_ephemeral));
  for (std::size_t i = 0; i < 3; ++i) {
    auto& sender = i % 2 == 0 ? init : resp;
    auto& receiver = i % 2 == 0 ? resp : init;
    ASSERT_TRUE(sender.is_my_turn());
    ASSERT_FALSE(receiver.is_my_turn());
    auto written = sender.write_message(hex(v.messages[i].first));
    ASSERT_TRUE(written) << written.error().message();
    EXPECT_EQ(to_hex(written.value()), v.messages[i].second) << "handshake message " << i;
    auto read = receiver.read_message(written.value());
    ASSERT_TRUE(read) << read.error().message();
    EXPECT_EQ(to_hex(read.value()), v.messages[i].first);
  }
  ASSERT_TRUE(init.complete() && resp.complete());
  EXPECT_EQ(init.handshake_hash(), resp.handshake_hash());
  if (*v.handshake_hash) {
    EXPECT_EQ(to_hex(init.handshake_hash()), v.handshake_hash);
  }
  EXPECT_EQ(*init.remote_static(), x_key(v.resp_static).public_key);
  EXPECT_EQ(*resp.remote_static(), x_key(v.init_static).public_key);

  auto ti = init.split().value();
  auto tr = resp.split().value();
  for (std::size_t i = 3; i < v.messages.size(); ++i) {
    auto& send = i % 2 == 0 ? ti.send : tr.send;
    auto& recv = i % 2 == 0 ? tr.recv : ti.recv;
    Bytes payload = hex(v.messages[i].first);
    Bytes ct(payload.size() + kTagLen);
    ASSERT_TRUE(send.seal(payload.data(), payload.size(), ct.data()));
    EXPECT_EQ(to_hex(ct), v.messages[i].second) << "transport message " << i;
    Bytes pt(payload.size());
    ASSERT_TRUE(recv.open(ct.data(), ct.size(), pt.data()));
    EXPECT_EQ(pt, payload);
  }
}

// A completed pair of libp2p handshakes (and the identities behind them).
struct Pair {
  crypto::KeyPair init_id = crypto::KeyPair::generate();
  crypto::KeyPair resp_id = crypto::KeyPair::generate();
  Libp2pHandshake init;
  Libp2pHandshake resp;
  Pair(HandshakeConfig ic = {}, HandshakeConfig rc = {})
      : init(Role::initiator, init_id, std::move(ic)),
        resp(Role::responder, resp_id, std::move(rc)) {}
};

}  // namespace

TEST(NoisePrimitives, HkdfMatchesRfc5869TestCase3) {
  // Noise's HKDF is RFC 5869 with salt = chaining key and empty info; an empty HMAC key is
  // the same as 32 zero bytes (keys are zero-padded to the block size).
  Hash zero{};
  auto [o1, o2] = hkdf2(zero, Bytes(22, 0x0b));
  Bytes okm(o1.begin(), o1.end());
  okm.insert(okm.end(), o2.begin(), o2.begin() + 10);
  EXPECT_EQ(to_hex(okm),
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8");
}

TEST(NoisePrimitives, ProtocolNameIsTheInitialHash) {
  // 32 characters: h = the name itself, no hashing (Noise section 5.2).
  ASSERT_EQ(kProtocolName.size(), 32u);
  SymmetricState ss(kProtocolName);
  EXPECT_EQ(as_string(ss.handshake_hash()), kProtocolName);
}

TEST(NoisePrimitives, X25519RejectsLowOrderPoints) {
  auto kp = X25519KeyPair::generate();
  Bytes zero(32, 0);
  auto r = x25519(kp.secret, zero);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::protocol_violation);
  EXPECT_FALSE(x25519(kp.secret, Bytes(31, 1)));
  EXPECT_FALSE(X25519KeyPair::from_secret(Bytes(31, 1)));
}

TEST(NoiseVectors, Cacophony) {
  check_vector(kCacophony);
}
TEST(NoiseVectors, Snow) {
  check_vector(kSnow);
}

TEST(NoiseCipher, NonceAdvancesOnlyOnSuccessAndMaxIsReserved) {
  Key k{};
  k[0] = 7;
  CipherState a(k), b(k);
  Bytes msg = to_bytes("hello"), ct(msg.size() + kTagLen), pt(msg.size());
  ASSERT_TRUE(a.seal(msg.data(), msg.size(), ct.data()));
  EXPECT_EQ(a.nonce(), 1u);
  Bytes bad = ct;
  bad[2] ^= 1;
  auto r = b.open(bad.data(), bad.size(), pt.data());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::protocol_violation);
  EXPECT_EQ(b.nonce(), 0u);
  ASSERT_TRUE(b.open(ct.data(), ct.size(), pt.data()));
  EXPECT_EQ(pt, msg);
  EXPECT_FALSE(b.open(ct.data(), ct.size(), pt.data())) << "a replay must not decrypt";
  EXPECT_FALSE(b.open(ct.data(), kTagLen - 1, pt.data()));

  // In place works both ways.
  Bytes buf = msg;
  buf.resize(msg.size() + kTagLen);
  CipherState c(k), d(k);
  ASSERT_TRUE(c.seal(buf.data(), msg.size(), buf.data()));
  ASSERT_TRUE(d.open(buf.data(), buf.size(), buf.data()));
  EXPECT_EQ(Bytes(buf.begin(), buf.begin() + msg.size()), msg);

  // 2^64-2 is the last usable nonce; 2^64-1 is reserved.
  CipherState e(k), f(k);
  e.set_nonce(std::numeric_limits<std::uint64_t>::max() - 1);
  f.set_nonce(std::numeric_limits<std::uint64_t>::max() - 1);
  ASSERT_TRUE(e.seal(msg.data(), msg.size(), ct.data()));
  ASSERT_TRUE(f.open(ct.data(), ct.size(), pt.data()));
  EXPECT_FALSE(e.seal(msg.data(), msg.size(), ct.data()));
  EXPECT_FALSE(f.open(ct.data(), ct.size(), pt.data()));

  // Without a key, EncryptWithAd passes through.
  CipherState none;
  Bytes out;
  ASSERT_TRUE(none.encrypt_with_ad({}, msg, out));
  EXPECT_EQ(out, msg);
}

TEST(NoiseXX, RejectsTruncatedOversizeAndOutOfTurnMessages) {
  XXHandshake resp(Role::responder, X25519KeyPair::generate());
  EXPECT_FALSE(resp.write_message({})) << "the responder does not speak first";
  auto r = resp.read_message(Bytes(31, 9));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::protocol_violation);
  EXPECT_NE(r.error().context().find("truncated"), std::string::npos) << r.error().message();
  EXPECT_TRUE(resp.failed());
  EXPECT_FALSE(resp.read_message(Bytes(32, 9))) << "a failed handshake stays failed";

  XXHandshake resp2(Role::responder, X25519KeyPair::generate());
  auto big = resp2.read_message(Bytes(kMaxMessage + 1, 9));
  ASSERT_FALSE(big);
  EXPECT_EQ(big.error(), errc::too_large);

  XXHandshake init(Role::initiator, X25519KeyPair::generate());
  EXPECT_FALSE(init.read_message(Bytes(96, 0))) << "the initiator speaks first";
  XXHandshake init2(Role::initiator, X25519KeyPair::generate());
  auto huge = init2.write_message(Bytes(kMaxMessage, 0));
  ASSERT_FALSE(huge);
  EXPECT_EQ(huge.error(), errc::too_large);
  EXPECT_FALSE(init2.failed()) << "a refused write changes nothing";
  EXPECT_TRUE(init2.write_message(Bytes(kMaxMessage - 32, 0)));
}

TEST(NoiseXX, TamperingAnyByteOfMessage2Or3Fails) {
  auto s_i = X25519KeyPair::generate(), s_r = X25519KeyPair::generate();
  auto e_i = X25519KeyPair::generate(), e_r = X25519KeyPair::generate();
  auto fresh = [&] {
    return std::pair{XXHandshake(Role::initiator, s_i, {}, e_i),
                     XXHandshake(Role::responder, s_r, {}, e_r)};
  };
  auto [i0, r0] = fresh();
  Bytes m1 = i0.write_message({}).value();
  ASSERT_TRUE(r0.read_message(m1));
  Bytes m2 = r0.write_message(to_bytes("payload")).value();
  for (std::size_t pos = 0; pos < m2.size(); ++pos) {
    auto [i, r] = fresh();
    ASSERT_EQ(i.write_message({}).value(), m1);  // same keys, same transcript
    Bytes bad = m2;
    bad[pos] ^= 0x20;
    auto got = i.read_message(bad);
    ASSERT_FALSE(got) << "flipped byte " << pos;
    EXPECT_FALSE(i.remote_static().has_value());
    EXPECT_TRUE(i.failed());
  }
  ASSERT_TRUE(i0.read_message(m2));
  Bytes m3 = i0.write_message(to_bytes("x")).value();
  for (std::size_t pos = 0; pos < m3.size(); ++pos) {
    auto [i, r] = fresh();
    ASSERT_TRUE(r.read_message(i.write_message({}).value()));
    ASSERT_EQ(r.write_message(to_bytes("payload")).value(), m2);
    Bytes bad = m3;
    bad[pos] ^= 0x01;
    EXPECT_FALSE(r.read_message(bad)) << "flipped byte " << pos;
    EXPECT_FALSE(r.complete());
  }
}

TEST(NoisePayload, EncodesTheSpecFieldsAndVerifies) {
  auto id = crypto::KeyPair::generate();
  auto s = X25519KeyPair::generate();
  Bytes p = encode_handshake_payload(id, s.public_key, {"/yamux/1.0.0"});
  // Field 1 (identity_key, length-delimited) = tag 0x0a, then field 2 = 0x12, field 4 = 0x22.
  Bytes key_pb = id.public_key().to_protobuf();
  ASSERT_GT(p.size(), 2 + key_pb.size() + 2 + 64);
  EXPECT_EQ(p[0], 0x0a);
  EXPECT_EQ(p[1], key_pb.size());
  EXPECT_EQ(Bytes(p.begin() + 2, p.begin() + 2 + static_cast<long>(key_pb.size())), key_pb);
  std::size_t sig_at = 2 + key_pb.size();
  EXPECT_EQ(p[sig_at], 0x12);
  EXPECT_EQ(p[sig_at + 1], 64);
  Bytes sig(p.begin() + static_cast<long>(sig_at) + 2, p.begin() + static_cast<long>(sig_at) + 66);
  EXPECT_TRUE(id.public_key().verify(static_key_signing_message(s.public_key), sig));
  EXPECT_EQ(p[sig_at + 66], 0x22);

  auto v = verify_handshake_payload(p, s.public_key);
  ASSERT_TRUE(v) << v.error().message();
  EXPECT_EQ(v.value().key, id.public_key());
  EXPECT_EQ(v.value().peer, net::PeerId::from_public_key(id.public_key()));
  EXPECT_EQ(v.value().stream_muxers, std::vector<std::string>{"/yamux/1.0.0"});

  // Signed over another static key: rejected.
  auto other = X25519KeyPair::generate();
  auto bad = verify_handshake_payload(p, other.public_key);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error(), errc::protocol_violation);
  EXPECT_NE(bad.error().context().find("signature"), std::string::npos);

  // Garbage, missing fields, bad key encodings: rejected with a reason.
  EXPECT_FALSE(verify_handshake_payload(to_bytes("\xff\xff\xff"), s.public_key));
  EXPECT_FALSE(verify_handshake_payload({}, s.public_key));
  starling::pb::noise::NoiseHandshakePayload no_sig;
  no_sig.set_identity_key(key_pb.data(), key_pb.size());
  auto e1 = verify_handshake_payload(to_bytes(no_sig.SerializeAsString()), s.public_key);
  ASSERT_FALSE(e1);
  EXPECT_NE(e1.error().context().find("signature"), std::string::npos);
  starling::pb::noise::NoiseHandshakePayload bad_key;
  bad_key.set_identity_key(std::string("\x08\x01\x12\x03", 4) + "abc");  // 3-byte Ed25519
  bad_key.set_identity_sig(std::string(64, 'x'));
  auto e2 = verify_handshake_payload(to_bytes(bad_key.SerializeAsString()), s.public_key);
  ASSERT_FALSE(e2);
  EXPECT_EQ(e2.error(), errc::protocol_violation);
}

TEST(NoiseLibp2p, FullHandshakeAgreesOnKeysAndIdentities) {
  HandshakeConfig rc;
  rc.stream_muxers = {"/yamux/1.0.0", "/mplex/6.7.0"};
  Pair p({}, std::move(rc));
  ASSERT_TRUE(p.init.is_my_turn());
  Bytes m1 = p.init.write_message().value();
  EXPECT_EQ(m1.size(), 32u) << "message 1 carries only the ephemeral key";
  ASSERT_TRUE(p.resp.read_message(m1));
  ASSERT_TRUE(p.init.read_message(p.resp.write_message().value()));
  EXPECT_FALSE(p.init.complete()) << "message 3 still to send";
  ASSERT_TRUE(p.resp.read_message(p.init.write_message().value()));
  ASSERT_TRUE(p.init.complete() && p.resp.complete());
  EXPECT_EQ(p.init.remote()->peer, net::PeerId::from_public_key(p.resp_id.public_key()));
  EXPECT_EQ(p.resp.remote()->peer, net::PeerId::from_public_key(p.init_id.public_key()));
  EXPECT_EQ(p.init.remote()->stream_muxers,
            (std::vector<std::string>{"/yamux/1.0.0", "/mplex/6.7.0"}));
  EXPECT_TRUE(p.resp.remote()->stream_muxers.empty());

  auto ti = p.init.split().value(), tr = p.resp.split().value();
  EXPECT_EQ(ti.handshake_hash, tr.handshake_hash);
  Bytes msg = to_bytes("ping"), ct(4 + kTagLen), pt(4);
  ASSERT_TRUE(ti.send.seal(msg.data(), 4, ct.data()));
  ASSERT_TRUE(tr.recv.open(ct.data(), ct.size(), pt.data()));
  EXPECT_EQ(pt, msg);
  ASSERT_TRUE(tr.send.seal(msg.data(), 4, ct.data()));
  ASSERT_TRUE(ti.recv.open(ct.data(), ct.size(), pt.data()));
  EXPECT_FALSE(ti.recv.open(ct.data(), ct.size(), pt.data()));
}

TEST(NoiseLibp2p, WrongExpectedPeerFailsBeforeMessage3) {
  HandshakeConfig ic;
  auto stranger = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
  ic.expected_remote = stranger;
  Pair p(std::move(ic));
  ASSERT_TRUE(p.resp.read_message(p.init.write_message().value()));
  auto r = p.init.read_message(p.resp.write_message().value());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::protocol_violation);
  auto actual = net::PeerId::from_public_key(p.resp_id.public_key());
  EXPECT_NE(r.error().context().find(stranger.to_string()), std::string::npos);
  EXPECT_NE(r.error().context().find(actual.to_string()), std::string::npos);
  EXPECT_TRUE(p.init.failed());
  EXPECT_FALSE(p.init.is_my_turn());
  EXPECT_FALSE(p.init.write_message()) << "no message 3 (our identity) after a mismatch";
}

TEST(NoiseLibp2p, PayloadSignedForAnotherStaticKeyIsRejected) {
  // A responder that signs a static key other than the one it uses in the handshake.
  auto init_id = crypto::KeyPair::generate();
  auto resp_id = crypto::KeyPair::generate();
  Libp2pHandshake init(Role::initiator, init_id);
  XXHandshake resp(Role::responder, X25519KeyPair::generate());
  ASSERT_TRUE(resp.read_message(init.write_message().value()));
  Bytes forged = encode_handshake_payload(resp_id, X25519KeyPair::generate().public_key);
  auto r = init.read_message(resp.write_message(forged).value());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::protocol_violation);
  EXPECT_NE(r.error().context().find("signature"), std::string::npos) << r.error().message();

  // And one that sends no payload at all.
  Libp2pHandshake init2(Role::initiator, init_id);
  XXHandshake resp2(Role::responder, X25519KeyPair::generate());
  ASSERT_TRUE(resp2.read_message(init2.write_message().value()));
  auto r2 = init2.read_message(resp2.write_message({}).value());
  ASSERT_FALSE(r2);
  EXPECT_NE(r2.error().context().find("identity key"), std::string::npos) << r2.error().message();
}

TEST(NoiseLibp2p, ResponderIgnoresAPayloadInMessage1) {
  auto resp_id = crypto::KeyPair::generate();
  Libp2pHandshake resp(Role::responder, resp_id);
  XXHandshake init(Role::initiator, X25519KeyPair::generate());
  ASSERT_TRUE(resp.read_message(init.write_message(to_bytes("early")).value()));
  EXPECT_TRUE(resp.is_my_turn());
}
