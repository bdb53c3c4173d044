// DCUtR: HolePunch wire format (round trip, limits, bad input) and the I/O-free state machine
// (role choice, RTT/2 timing, retries, timeouts, out-of-turn messages).
#include <gtest/gtest.h>

#include "starling/net/dcutr.hpp"
#include "starling/pb/dcutr.pb.h"

using namespace starling;
using namespace starling::net;
using Kind = DcutrAction::Kind;
using State = DcutrMachine::State;

namespace {
Multiaddr ma(std::string_view s) {
  return Multiaddr::parse(s).value();
}

Bytes raw(const pb::HolePunch& p) {
  Bytes out(p.ByteSizeLong());
  p.SerializeToArray(out.data(), static_cast<int>(out.size()));
  return out;
}

HolePunchMsg msg(HolePunchMsg::Type t, std::vector<Multiaddr> addrs = {}) {
  HolePunchMsg m;
  m.type = t;
  m.addrs = std::move(addrs);
  return m;
}

DcutrConfig cfg() {
  DcutrConfig c;
  c.message_timeout = 5s;
  c.dial_timeout = 2s;
  return c;
}

const auto kConnect = HolePunchMsg::Type::connect;
const auto kSync = HolePunchMsg::Type::sync;
}  // namespace

TEST(DcutrWire, RoundTrip) {
  auto m = msg(kConnect, {ma("/ip4/1.2.3.4/tcp/4001"), ma("/ip6/2001:db8::1/tcp/5")});
  auto back = parse_hole_punch(encode_hole_punch(m));
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back.value().type, kConnect);
  EXPECT_EQ(back.value().addrs, m.addrs);
  auto sync = parse_hole_punch(encode_hole_punch(msg(kSync)));
  ASSERT_TRUE(sync);
  EXPECT_EQ(sync.value().type, kSync);
  EXPECT_TRUE(sync.value().addrs.empty());
}

TEST(DcutrWire, FramedWithVarintLength) {
  auto m = msg(kSync);
  auto body = encode_hole_punch(m);
  auto framed = frame_hole_punch(m);
  ASSERT_EQ(framed.size(), body.size() + 1);
  EXPECT_EQ(framed[0], body.size());
  // Spec bytes: field 1 varint 300 = 08 ac 02.
  EXPECT_EQ(body, (Bytes{0x08, 0xac, 0x02}));
}

TEST(DcutrWire, RejectsBadInput) {
  EXPECT_FALSE(parse_hole_punch(Bytes{}));            // required type missing
  EXPECT_FALSE(parse_hole_punch(Bytes{0x08, 0x05}));  // unknown type 5
  EXPECT_FALSE(parse_hole_punch(Bytes{0x12, 0x10}));  // truncated bytes field
  EXPECT_FALSE(parse_hole_punch(Bytes{0xff, 0xff, 0xff}));
  pb::HolePunch big;
  big.set_type(pb::HolePunch::CONNECT);
  big.add_obsaddrs(std::string(kMaxHolePunchMessage, 'x'));
  EXPECT_FALSE(parse_hole_punch(raw(big)));
}

TEST(DcutrWire, SkipsBadAddressesAndCapsCount) {
  pb::HolePunch p;
  p.set_type(pb::HolePunch::CONNECT);
  p.add_obsaddrs("garbage");
  auto good = ma("/ip4/8.8.8.8/tcp/1").to_bytes();
  for (int i = 0; i < 100; ++i) p.add_obsaddrs(good.data(), good.size());
  auto m = parse_hole_punch(raw(p));
  ASSERT_TRUE(m);
  EXPECT_EQ(m.value().addrs.size(), kMaxHolePunchAddrs);
}

TEST(DcutrWire, DialableFilter) {
  EXPECT_TRUE(dcutr_dialable(ma("/ip4/8.8.8.8/tcp/4001"), false));
  EXPECT_FALSE(dcutr_dialable(ma("/ip4/192.168.1.2/tcp/4001"), false));
  EXPECT_TRUE(dcutr_dialable(ma("/ip4/192.168.1.2/tcp/4001"), true));
  EXPECT_FALSE(dcutr_dialable(ma("/ip4/0.0.0.0/tcp/4001"), true));
  EXPECT_FALSE(dcutr_dialable(ma("/ip4/8.8.8.8/tcp/0"), true));
  EXPECT_FALSE(dcutr_dialable(ma("/ip4/8.8.8.8/udp/4001/quic-v1"), true));
  auto circuit = ma("/ip4/8.8.8.8/tcp/4001").with_circuit();
  EXPECT_FALSE(dcutr_dialable(circuit, true));
  auto dup = dcutr_filter({ma("/ip4/8.8.8.8/tcp/1"), ma("/ip4/8.8.8.8/tcp/1")}, false);
  EXPECT_EQ(dup.size(), 1u);
}

TEST(DcutrRoles, InboundRelayedIsInitiatorAndUpgradeServer) {
  EXPECT_EQ(dcutr_role(true), DcutrRole::initiator);   // B: accepted through the relay
  EXPECT_EQ(dcutr_role(false), DcutrRole::responder);  // A: dialed through the relay
  EXPECT_FALSE(dcutr_upgrade_as_client(DcutrRole::initiator));
  EXPECT_TRUE(dcutr_upgrade_as_client(DcutrRole::responder));
}

// B and A exchange messages in memory: B dials RTT/2 after SYNC, A at once.
TEST(DcutrMachine, HappyPathTiming) {
  const auto a_addr = ma("/ip4/10.0.1.2/tcp/4001"), b_addr = ma("/ip4/10.0.2.2/tcp/4002");
  auto c = cfg();
  c.allow_private = true;
  DcutrMachine b(DcutrRole::initiator, {b_addr}, c), a(DcutrRole::responder, {a_addr}, c);
  TimePoint t0{std::chrono::seconds(100)};
  EXPECT_TRUE(a.start(t0).empty());
  auto b1 = b.start(t0);
  ASSERT_EQ(b1.size(), 1u);
  ASSERT_EQ(b1[0].kind, Kind::send);
  EXPECT_EQ(b1[0].message.type, kConnect);
  EXPECT_EQ(b.state(), State::await_connect);
  // One-way delay 30 ms: CONNECT reaches A at t0+30ms, A's CONNECT reaches B at t0+60ms.
  auto a1 = a.on_message(b1[0].message, t0 + 30ms);
  ASSERT_EQ(a1.size(), 1u);
  EXPECT_EQ(a1[0].kind, Kind::send);
  EXPECT_EQ(a1[0].message.addrs, std::vector<Multiaddr>{a_addr});
  auto b2 = b.on_message(a1[0].message, t0 + 60ms);
  ASSERT_EQ(b2.size(), 2u);
  EXPECT_EQ(b2[0].kind, Kind::send);
  EXPECT_EQ(b2[0].message.type, kSync);
  EXPECT_EQ(b2[1].kind, Kind::dial);
  EXPECT_EQ(b2[1].at, t0 + 90ms);  // RTT 60 ms: dial after RTT/2
  EXPECT_EQ(b2[1].addrs, std::vector<Multiaddr>{a_addr});
  EXPECT_EQ(b.last_rtt(), Duration(60ms));
  auto a2 = a.on_message(b2[0].message, t0 + 90ms);  // SYNC arrives RTT/2 later
  ASSERT_EQ(a2.size(), 1u);
  EXPECT_EQ(a2[0].kind, Kind::dial);
  EXPECT_EQ(a2[0].at, t0 + 90ms);  // both dial at the same moment
  EXPECT_EQ(a2[0].addrs, std::vector<Multiaddr>{b_addr});
  auto b3 = b.on_dial_result(true, t0 + 100ms);
  ASSERT_EQ(b3.size(), 1u);
  EXPECT_EQ(b3[0].kind, Kind::succeeded);
  EXPECT_EQ(a.on_dial_result(true, t0 + 100ms)[0].kind, Kind::succeeded);
  EXPECT_TRUE(a.done());
  EXPECT_FALSE(b.deadline());
}

TEST(DcutrMachine, InitiatorRetriesThenGivesUp) {
  auto c = cfg();
  DcutrMachine b(DcutrRole::initiator, {ma("/ip4/8.8.4.4/tcp/1")}, c);
  TimePoint t{std::chrono::seconds(1)};
  const auto peer = msg(kConnect, {ma("/ip4/8.8.8.8/tcp/2")});
  ASSERT_EQ(b.start(t)[0].kind, Kind::send);
  for (int i = 1; i <= kDcutrMaxAttempts; ++i) {
    EXPECT_EQ(b.attempts(), i);
    auto acts = b.on_message(peer, t);
    ASSERT_EQ(acts.size(), 2u);
    ASSERT_TRUE(b.deadline());
    EXPECT_EQ(*b.deadline(), acts[1].at + c.dial_timeout);
    // Before the deadline nothing happens; at it the attempt fails.
    EXPECT_TRUE(b.on_timeout(*b.deadline() - 1ms).empty());
    t = *b.deadline();
    auto next = b.on_timeout(t);
    ASSERT_EQ(next.size(), 1u);
    if (i < kDcutrMaxAttempts) {
      EXPECT_EQ(next[0].kind, Kind::send);  // a fresh CONNECT
      EXPECT_EQ(next[0].message.type, kConnect);
    } else {
      EXPECT_EQ(next[0].kind, Kind::failed);
      EXPECT_NE(next[0].reason.find("attempt 3 of 3"), std::string::npos) << next[0].reason;
    }
  }
  EXPECT_EQ(b.state(), State::failed);
  EXPECT_TRUE(b.on_message(peer, t).empty());  // done: ignored
}

TEST(DcutrMachine, DialFailureRetriesAndSuccessOnSecondAttempt) {
  DcutrMachine b(DcutrRole::initiator, {ma("/ip4/8.8.4.4/tcp/1")}, cfg());
  DcutrMachine a(DcutrRole::responder, {ma("/ip4/8.8.8.8/tcp/2")}, cfg());
  TimePoint t{};
  a.start(t);
  auto out = b.start(t);
  for (int attempt = 1; attempt <= 2; ++attempt) {
    auto reply = a.on_message(out[0].message, t);
    auto sync = b.on_message(reply[0].message, t);
    ASSERT_EQ(a.on_message(sync[0].message, t)[0].kind, Kind::dial);
    if (attempt == 1) {
      EXPECT_TRUE(a.on_dial_result(false, t).empty());  // back to waiting for CONNECT
      EXPECT_EQ(a.state(), State::idle);
      out = b.on_dial_result(false, t);
      ASSERT_EQ(out[0].kind, Kind::send);
    }
  }
  EXPECT_EQ(b.on_dial_result(true, t)[0].kind, Kind::succeeded);
  EXPECT_EQ(a.attempts(), 2);
}

TEST(DcutrMachine, ResponderTimeouts) {
  DcutrMachine a(DcutrRole::responder, {ma("/ip4/8.8.8.8/tcp/2")}, cfg());
  TimePoint t{};
  a.start(t);
  ASSERT_TRUE(a.deadline());
  EXPECT_EQ(*a.deadline(), t + 5s);
  a.on_message(msg(kConnect, {ma("/ip4/8.8.4.4/tcp/1")}), t + 1s);
  EXPECT_EQ(a.state(), State::await_sync);
  auto f = a.on_timeout(t + 6s);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].kind, Kind::failed);
}

TEST(DcutrMachine, OutOfTurnMessagesFail) {
  TimePoint t{};
  {
    DcutrMachine b(DcutrRole::initiator, {ma("/ip4/8.8.4.4/tcp/1")}, cfg());
    b.start(t);
    EXPECT_EQ(b.on_message(msg(kSync), t)[0].kind, Kind::failed);  // SYNC instead of CONNECT
  }
  {
    DcutrMachine a(DcutrRole::responder, {ma("/ip4/8.8.8.8/tcp/2")}, cfg());
    a.start(t);
    EXPECT_EQ(a.on_message(msg(kSync), t)[0].kind, Kind::failed);  // SYNC before CONNECT
  }
  {
    DcutrMachine a(DcutrRole::responder, {ma("/ip4/8.8.8.8/tcp/2")}, cfg());
    a.start(t);
    a.on_message(msg(kConnect, {ma("/ip4/8.8.4.4/tcp/1")}), t);
    EXPECT_EQ(a.on_message(msg(kConnect, {ma("/ip4/8.8.4.4/tcp/1")}), t)[0].kind, Kind::failed);
  }
  {
    // No public address offered (private ones are filtered out): nothing to punch.
    DcutrMachine b(DcutrRole::initiator, {ma("/ip4/8.8.4.4/tcp/1")}, cfg());
    b.start(t);
    auto f = b.on_message(msg(kConnect, {ma("/ip4/192.168.0.1/tcp/1")}), t);
    EXPECT_EQ(f[0].kind, Kind::failed);
  }
  {
    DcutrMachine b(DcutrRole::initiator, {}, cfg());
    EXPECT_EQ(b.start(t)[0].kind, Kind::failed);  // nothing of ours to offer
  }
}

TEST(DcutrMachine, ResponderRefusesEndlessConnects) {
  DcutrMachine a(DcutrRole::responder, {ma("/ip4/8.8.8.8/tcp/2")}, cfg());
  TimePoint t{};
  a.start(t);
  const auto c = msg(kConnect, {ma("/ip4/8.8.4.4/tcp/1")});
  for (int i = 0; i < kDcutrMaxAttempts; ++i) {
    ASSERT_EQ(a.on_message(c, t)[0].kind, Kind::send);
    a.on_message(msg(kSync), t);
    ASSERT_EQ(a.state(), State::dialing);
  }
  EXPECT_EQ(a.on_message(c, t)[0].kind, Kind::failed);
}
