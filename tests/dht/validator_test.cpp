// Validation: owner signatures (valid, unsigned, forged, wrong owner, re-targeted, replayed,
// outside the window), size limits, schemas, and the chain.
#include <gtest/gtest.h>

#include "starling/dht/signing.hpp"
#include "starling/dht/validator.hpp"

using namespace starling;
using namespace starling::dht;

namespace {
const WallTime wall = WallTime(std::chrono::seconds(1'700'000'000));
const ValidationContext ctx{wall, std::chrono::minutes(10)};
std::uint64_t version_at(WallTime t) {
  return static_cast<std::uint64_t>(wall_micros(t));
}

struct Owner {
  crypto::KeyPair key = crypto::KeyPair::generate();
  net::PeerId peer = net::PeerId::from_public_key(key.public_key());
  std::string marker() const { return owner_marker(peer); }
};

result<void> check(const RecordKey& k, Record r) {
  return ValidatorChain::standard().validate(k, r, ctx);
}
}  // namespace

TEST(OwnerMarkers, ParsesAndRejectsMalformed) {
  Owner a, b;
  auto owners = owners_in(as_bytes("x" + a.marker() + "y" + b.marker() + a.marker()));
  ASSERT_TRUE(owners) << owners.error().message();
  ASSERT_EQ(owners.value().size(), 2u);
  EXPECT_EQ(owners.value()[0], a.peer);
  EXPECT_EQ(owners.value()[1], b.peer);
  EXPECT_TRUE(owners_in(as_bytes("no markers here")).value().empty());
  EXPECT_EQ(owners_in(as_bytes("[owner:12D3KooW")).error(), dht_errc::bad_owner_marker);
  EXPECT_EQ(owners_in(as_bytes("[owner:notapeer]")).error(), dht_errc::bad_owner_marker);
  // A sha2-256 peer id ("Qm...") does not inline a key: nobody could verify its signatures.
  Bytes mh{0x12, 0x20};
  mh.resize(34, 7);
  auto qm = net::PeerId::from_bytes(mh).value();
  EXPECT_EQ(owners_in(as_bytes("[owner:" + qm.to_string() + "]")).error(),
            dht_errc::bad_owner_marker);
}

TEST(OwnerSignature, AcceptsOwnersRecordAndCutsTtlToWindow) {
  Owner a;
  const auto key = RecordKey::from_string("peers/" + a.marker());
  auto rec = make_signed_record(a.key, key, std::nullopt, to_bytes("v"), 60s, version_at(wall));
  auto ok = check(key, rec);
  EXPECT_TRUE(ok) << ok.error().message();
  // Forwarded with an inflated ttl: cut to version + lifetime + skew - now.
  rec.ttl = std::chrono::hours(5);
  ASSERT_TRUE(ValidatorChain::standard().validate(key, rec, ctx));
  EXPECT_EQ(rec.ttl, Millis(60s + 10min));
}

TEST(OwnerSignature, RejectsUnsignedForgedWrongOwnerAndRetargeted) {
  Owner a, b;
  const auto key = RecordKey::from_string("peers/" + a.marker());
  auto good = make_signed_record(a.key, key, std::nullopt, to_bytes("v"), 60s, version_at(wall));

  Record unsigned_rec = good;
  unsigned_rec.body.signature.clear();
  EXPECT_EQ(check(key, unsigned_rec).error(), dht_errc::missing_signature);

  Record forged = good;  // value changed after signing
  forged.body.value = to_bytes("evil");
  EXPECT_EQ(check(key, forged).error(), dht_errc::bad_signature);

  Record flipped = good;  // a bit of the signature flipped
  flipped.body.signature[10] ^= 1;
  EXPECT_EQ(check(key, flipped).error(), dht_errc::bad_signature);

  Record later = good;  // version bumped without re-signing (a replay dressed as new)
  later.body.version += 1;
  EXPECT_EQ(check(key, later).error(), dht_errc::bad_signature);

  Record longer = good;  // lifetime extended without re-signing
  longer.body.lifetime = std::chrono::hours(24);
  EXPECT_EQ(check(key, longer).error(), dht_errc::bad_signature);

  // Signed by b for a's key.
  auto wrong = make_signed_record(b.key, key, std::nullopt, to_bytes("v"), 60s, version_at(wall));
  EXPECT_EQ(check(key, wrong).error(), dht_errc::bad_signature);

  // a's valid signature moved to another key of a's, or to a sub-key.
  const auto other = RecordKey::from_string("other/" + a.marker());
  EXPECT_EQ(check(other, good).error(), dht_errc::bad_signature);
  Record as_sub = good;
  as_sub.subkey = SubKey::from_string("x");
  EXPECT_EQ(check(key, as_sub).error(), dht_errc::bad_signature);
}

TEST(OwnerSignature, SubKeyOwnersAndMultipleOwners) {
  Owner a, b;
  const auto key = RecordKey::from_string("group/members");
  const auto sk = SubKey::from_string(a.marker());
  auto rec = make_signed_record(a.key, key, sk, to_bytes("hello"), 30s, version_at(wall));
  EXPECT_TRUE(check(key, rec));
  // b cannot write a's sub-key; nobody can write it unsigned.
  EXPECT_EQ(
      check(key, make_signed_record(b.key, key, sk, to_bytes("x"), 30s, version_at(wall))).error(),
      dht_errc::bad_signature);
  Record plain{sk, RecordBody{to_bytes("x"), version_at(wall), {}, {}}, 30s};
  EXPECT_EQ(check(key, plain).error(), dht_errc::missing_signature);
  // Key owned by a, sub-key owned by b: rejected whoever signs.
  const auto akey = RecordKey::from_string("k" + a.marker());
  const auto bsub = SubKey::from_string(b.marker());
  EXPECT_EQ(check(akey, make_signed_record(a.key, akey, bsub, to_bytes("x"), 30s, version_at(wall)))
                .error(),
            dht_errc::multiple_owners);
  // Unowned record carrying a signature.
  const auto free_key = RecordKey::from_string("free");
  auto stray =
      make_signed_record(a.key, free_key, std::nullopt, to_bytes("x"), 30s, version_at(wall));
  EXPECT_EQ(check(free_key, stray).error(), dht_errc::unexpected_signature);
  stray.body.signature.clear();
  EXPECT_TRUE(check(free_key, stray));
}

TEST(OwnerSignature, ReplayWindowUsesWallClockOnlyCoarsely) {
  Owner a;
  const auto key = RecordKey::from_string("status/" + a.marker());
  // Signed 1 minute ago for 2 minutes: fine.
  EXPECT_TRUE(check(key, make_signed_record(a.key, key, std::nullopt, to_bytes("v"), 2min,
                                            version_at(wall - 1min))));
  // Signed 1 hour ago for 2 minutes, replayed now: its signed life (+ skew) is over.
  auto old =
      make_signed_record(a.key, key, std::nullopt, to_bytes("v"), 2min, version_at(wall - 1h));
  old.ttl = 2min;  // the replayer claims a fresh ttl
  EXPECT_EQ(check(key, old).error(), dht_errc::signature_window);
  // Signed by a clock 9 minutes ahead of ours: within the skew bound, accepted.
  EXPECT_TRUE(check(key, make_signed_record(a.key, key, std::nullopt, to_bytes("v"), 1min,
                                            version_at(wall + 9min))));
  // 11 minutes ahead (or pre-signed for the future): rejected.
  EXPECT_EQ(check(key, make_signed_record(a.key, key, std::nullopt, to_bytes("v"), 1min,
                                          version_at(wall + 11min)))
                .error(),
            dht_errc::signature_window);
}

TEST(Validators, SizesSchemasAndChainOrder) {
  WireLimits lim;
  lim.max_value_bytes = 10;
  auto chain = ValidatorChain::standard(lim);
  Record big{std::nullopt, RecordBody{Bytes(11, 1), 1, {}, {}}, 10s};
  EXPECT_EQ(chain.validate(RecordKey::from_string("k"), big, ctx).error(), errc::too_large);
  Record expired{std::nullopt, RecordBody{Bytes(1, 1), 1, {}, {}}, Millis(0)};
  EXPECT_EQ(chain.validate(RecordKey::from_string("k"), expired, ctx).error(), dht_errc::expired);

  std::vector<SchemaValidator::Rule> rules(3);
  rules[0].prefix = "metrics/";
  rules[0].shape = SchemaValidator::Shape::dictionary;
  rules[0].max_ttl = 30s;
  rules[1].prefix = "metrics/loss";
  rules[1].shape = SchemaValidator::Shape::dictionary;
  rules[1].check = [](const Record& r) -> result<void> {
    if (r.body.value.size() != 4) return make_error(errc::invalid_argument, "need a float32");
    return success();
  };
  rules[2].prefix = "config";
  rules[2].shape = SchemaValidator::Shape::plain;
  ValidatorChain schema;
  schema.add(std::make_shared<SchemaValidator>(rules, /*reject_unmatched=*/true));

  Record sub{SubKey::from_string("peer1"), RecordBody{Bytes(4, 0), 1, {}, {}}, 10min};
  Record plain{std::nullopt, RecordBody{Bytes(4, 0), 1, {}, {}}, 10min};
  Record r = sub;
  EXPECT_TRUE(schema.validate(RecordKey::from_string("metrics/step"), r, ctx));
  EXPECT_EQ(r.ttl, Millis(30s));  // cut by the rule
  r = plain;
  EXPECT_EQ(schema.validate(RecordKey::from_string("metrics/step"), r, ctx).error(),
            dht_errc::schema);
  // Longest prefix applies: metrics/loss needs 4-byte values.
  r = sub;
  r.body.value.resize(3);
  EXPECT_EQ(schema.validate(RecordKey::from_string("metrics/loss"), r, ctx).error(),
            dht_errc::schema);
  r = sub;
  EXPECT_EQ(schema.validate(RecordKey::from_string("config"), r, ctx).error(), dht_errc::schema);
  r = plain;
  EXPECT_TRUE(schema.validate(RecordKey::from_string("config"), r, ctx));
  r = plain;
  EXPECT_EQ(schema.validate(RecordKey::from_string("elsewhere"), r, ctx).error(), dht_errc::schema);
}

TEST(OwnerSignature, RemembersVerifiedSignaturesWithoutTrustingLookalikes) {
  Owner a, b;
  const OwnerSignatureValidator v;
  const auto key = RecordKey::from_string("peers/" + a.marker());
  auto good = make_signed_record(a.key, key, std::nullopt, to_bytes("v"), 60s, version_at(wall));
  auto run = [&](const RecordKey& k, Record r, const ValidationContext& c = ctx) {
    return v.validate(k, r, c);
  };
  ASSERT_TRUE(run(key, good));
  ASSERT_TRUE(run(key, good));
  EXPECT_EQ(v.verifications(), 1u);  // the repeat was found in the memory
  EXPECT_EQ(v.remembered(), 1u);

  // Every variant of a remembered record is verified (and rejected) again.
  Record forged = good;
  forged.body.value = to_bytes("evil");
  EXPECT_EQ(run(key, forged).error(), dht_errc::bad_signature);
  Record flipped = good;
  flipped.body.signature[10] ^= 1;
  EXPECT_EQ(run(key, flipped).error(), dht_errc::bad_signature);
  Record later = good;
  later.body.version += 1;
  EXPECT_EQ(run(key, later).error(), dht_errc::bad_signature);
  EXPECT_EQ(run(RecordKey::from_string("other/" + a.marker()), good).error(),
            dht_errc::bad_signature);
  auto by_b = make_signed_record(b.key, key, std::nullopt, to_bytes("v"), 60s, version_at(wall));
  EXPECT_EQ(run(key, by_b).error(), dht_errc::bad_signature);
  EXPECT_EQ(v.remembered(), 1u);
  // The signing window is checked every time: the remembered record replayed an hour later.
  const ValidationContext later_ctx{wall + 1h, std::chrono::minutes(10)};
  EXPECT_EQ(run(key, good, later_ctx).error(), dht_errc::signature_window);

  // Bounded: after kVerifiedMemory other records, the first one is verified again.
  for (std::size_t i = 0; i < OwnerSignatureValidator::kVerifiedMemory; ++i)
    ASSERT_TRUE(run(key, make_signed_record(a.key, key, std::nullopt, to_bytes(std::to_string(i)),
                                            60s, version_at(wall))));
  const auto before = v.verifications();
  ASSERT_TRUE(run(key, good));
  EXPECT_EQ(v.verifications(), before + 1);
}
