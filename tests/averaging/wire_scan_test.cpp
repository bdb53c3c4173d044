// The protobuf pre-scan (src/averaging/wire_scan.hpp): every frame the codec writes passes it;
// unknown fields, repeated singular fields, wrong wire types and oversized lengths do not.
#include <gtest/gtest.h>

#include "averaging/wire_scan.hpp"
#include "starling/averaging/wire.hpp"

using namespace starling;
using namespace starling::averaging;
namespace scan = starling::averaging::wire::scan;

namespace {

MemberInfo member() {
  return {PeerKey(Bytes(34, 1)), {"/ip4/1.2.3.4/tcp/5", "/ip4/5.6.7.8/tcp/9"}, 1000, false, 2.5};
}

void append_tag(Bytes& b, std::uint32_t field, std::uint32_t wt) {
  append_uvarint(b, (static_cast<std::uint64_t>(field) << 3) | wt);
}

}  // namespace

TEST(WireScan, EveryEncodedFramePasses) {
  FinReport rep{1, Bitset(40), Bitset(3), Bitset(3), Bitset(3, true)};
  float data[4] = {1, 2, 3, 4};
  std::vector<RoundMessage> msgs{PartMsg{2, 7, data, 1.5}, ResultMsg{0, 3, Bitset(3, true), data},
                                 FinMsg{1, 2, {rep, rep}}};
  for (const auto& m : msgs) EXPECT_TRUE(scan::check(wire::encode_round(m, 16), scan::kRoundFrame));
  EXPECT_TRUE(scan::check(wire::encode_hello({Bytes(16, 3), 1, 2}), scan::kRoundFrame));
  EXPECT_TRUE(scan::check(wire::encode_keepalive(), scan::kRoundFrame));
  GroupInfo g{Bytes(16, 4), {member(), member()}, Bytes(32, 5)};
  EXPECT_TRUE(scan::check(wire::encode_match(StartMsg{g}), scan::kMatchFrame));
  EXPECT_TRUE(scan::check(
      wire::encode_match(JoinRequest{member(), Bytes(32, 1), "key[3]", WallClock::now()}),
      scan::kMatchFrame));
  StateManifest man{Bytes(32, 1),
                    9,
                    to_bytes("meta"),
                    Bytes(32, 2),
                    10,
                    4,
                    {Bytes(32, 1), Bytes(32, 2), Bytes(32, 3)}};
  EXPECT_TRUE(scan::check(wire::encode_state_frame(StateFrame{man, {}, 0, {}}), scan::kStateFrame));
  EXPECT_TRUE(scan::check(wire::encode_state_request(StateRequest{false, Bytes(32, 1), {1, 2, 3}}),
                          scan::kStateRequest));
  EXPECT_TRUE(scan::check(wire::encode_announcement({member(), 4, Bytes(32, 1), WallClock::now()}),
                          scan::kStateAnnouncement));
}

TEST(WireScan, RejectsWhatTheParserWouldAccept) {
  const Bytes ok = wire::encode_hello({Bytes(16, 3), 1, 2});
  ASSERT_TRUE(scan::check(ok, scan::kRoundFrame));
  ASSERT_TRUE(wire::decode_round(ok, 4));
  auto with = [&](auto&& add) {
    Bytes b = ok;
    add(b);
    return b;
  };
  // An unknown field (protobuf would skip it, after allocating it as an unknown field).
  auto unknown = with([](Bytes& b) {
    append_tag(b, 99, 2);
    append_uvarint(b, 3);
    b.insert(b.end(), 3, 0);
  });
  EXPECT_FALSE(scan::check(unknown, scan::kRoundFrame));
  EXPECT_FALSE(wire::decode_round(unknown, 4));
  // A singular field twice (protobuf keeps the last).
  auto twice = with([](Bytes& b) {
    append_tag(b, 9, 0);
    append_uvarint(b, 3);
  });
  EXPECT_FALSE(scan::check(twice, scan::kRoundFrame));
  EXPECT_FALSE(wire::decode_round(twice, 4));
  // A wrong wire type, a length beyond the frame, a length above the field's limit.
  Bytes wrong;
  append_tag(wrong, 11, 0);  // weight is a double
  append_uvarint(wrong, 1);
  EXPECT_FALSE(scan::check(wrong, scan::kRoundFrame));
  Bytes beyond;
  append_tag(beyond, 8, 2);
  append_uvarint(beyond, std::uint64_t{1} << 30);
  EXPECT_FALSE(scan::check(beyond, scan::kRoundFrame));
  Bytes long_id;
  append_tag(long_id, 8, 2);
  append_uvarint(long_id, 65);
  long_id.insert(long_id.end(), 65, 1);
  EXPECT_FALSE(scan::check(long_id, scan::kRoundFrame));
  // Truncated varints and tags.
  EXPECT_FALSE(scan::check(Bytes{0x08, 0x80}, scan::kRoundFrame));
  EXPECT_FALSE(scan::check(Bytes{0x80}, scan::kRoundFrame));
}

TEST(WireScan, NestedAndRepeatedLimits) {
  // A member with more addresses than allowed, inside a state announcement.
  MemberInfo m = member();
  m.addrs.assign(wire::kMaxAddrs + 1, "/ip4/1.2.3.4/tcp/5");
  auto b = wire::encode_announcement({m, 4, Bytes(32, 1), WallClock::now()});
  EXPECT_FALSE(scan::check(b, scan::kStateAnnouncement));
  EXPECT_FALSE(wire::decode_announcement(b));
  // Packed repeated parts count like unpacked ones: 256 pass, 257 do not.
  for (std::uint32_t n : {256u, 257u}) {
    Bytes r;
    append_tag(r, 3, 2);
    append_uvarint(r, n);
    r.insert(r.end(), n, 1);
    EXPECT_EQ(static_cast<bool>(scan::check(r, scan::kStateRequest)), n == 256) << n;
  }
}

// Accountability on the all-reduce stream: ACCT frames carry one statement, PART and RESULT
// frames their receipt; an empty statement and an oversized receipt are refused.
TEST(WireScan, AccountabilityFields) {
  float data[4] = {1, 2, 3, 4};
  const Bytes receipt(300, 7);
  auto part = wire::decode_round(wire::encode_round(PartMsg{0, 1, data, 1.0}, 16, receipt), 3);
  ASSERT_TRUE(part);
  EXPECT_EQ(part.value().receipt, receipt);
  auto res = wire::decode_round(
      wire::encode_round(ResultMsg{0, 1, Bitset(3, true), data}, 16, receipt), 3);
  ASSERT_TRUE(res);
  EXPECT_EQ(res.value().receipt, receipt);
  auto plain = wire::decode_round(wire::encode_round(PartMsg{0, 1, data, 1.0}, 16), 3);
  ASSERT_TRUE(plain);
  EXPECT_TRUE(plain.value().receipt.empty());
  const Bytes statement(1000, 0xC3);
  auto acct = wire::decode_round(wire::encode_acct(statement), 3);
  ASSERT_TRUE(acct);
  ASSERT_TRUE(std::holds_alternative<wire::Acct>(acct.value().msg));
  EXPECT_EQ(std::get<wire::Acct>(acct.value().msg).statement, statement);
  EXPECT_FALSE(wire::decode_round(wire::encode_acct({}), 3));
  const Bytes huge(64 * 1024, 7);
  EXPECT_FALSE(wire::decode_round(wire::encode_round(PartMsg{0, 1, data, 1.0}, 16, huge), 3));
}
