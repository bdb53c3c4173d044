// Wire codec: round trips of every message, shared peer table, and every limit.
#include <gtest/gtest.h>

#include "starling/crypto/keys.hpp"
#include "starling/dht/messages.hpp"
#include "starling/pb/dht.pb.h"

using namespace starling;
using namespace starling::dht;

namespace {
net::PeerId some_peer() {
  return net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
}
Record rec(std::optional<std::string> sk, std::string v) {
  Record r;
  if (sk) r.subkey = SubKey::from_string(*sk);
  r.body = RecordBody{to_bytes(v), 123456789, Millis(5000), Bytes(64, 9)};
  r.ttl = Millis(4321);
  return r;
}
Bytes raw(const google::protobuf::MessageLite& m) {
  std::string s = m.SerializeAsString();
  return Bytes(s.begin(), s.end());
}
}  // namespace

TEST(DhtMessages, RequestsRoundTrip) {
  NodeHeader h{false, {to_bytes("addr1"), to_bytes("addr2")}};
  std::vector<Request> reqs;
  reqs.push_back(Request{h, PingRequest{}});
  StoreRequest s;
  s.items.push_back(
      StoreItem{RecordKey::from_string("k1"), {rec(std::nullopt, "p"), rec("a", "x")}});
  s.items.push_back(StoreItem{RecordKey::from_string("k2"), {rec("", "empty sub-key")}});
  reqs.push_back(Request{NodeHeader{true, {}}, s});
  std::mt19937_64 rng(1);
  reqs.push_back(Request{h, FindRequest{{DhtId::random(rng), DhtId::random(rng)}, true}});
  reqs.push_back(Request{h, FindRequest{{DhtId::random(rng)}, true, true}});
  for (const auto& r : reqs) {
    auto back = decode_request(encode(r));
    ASSERT_TRUE(back) << back.error().message();
    EXPECT_EQ(back.value(), r);
  }
}

TEST(DhtMessages, ResponsesRoundTripWithSharedPeers) {
  const auto p1 = some_peer(), p2 = some_peer(), p3 = some_peer();
  FindResponse f;
  f.results.push_back(FindResult{{rec(std::nullopt, "v")}, {{p1, {to_bytes("a1")}}, {p2, {}}}});
  f.results.push_back(FindResult{{}, {{p2, {}}, {p3, {to_bytes("a3")}}}});
  f.results.push_back(FindResult{});
  Response r{NodeHeader{false, {to_bytes("me")}}, f};
  const Bytes wire = encode(r);
  auto back = decode_response(wire);
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back.value(), r);
  // p2 is written once.
  starling::pb::dht::Response m;
  ASSERT_TRUE(m.ParseFromArray(wire.data(), static_cast<int>(wire.size())));
  EXPECT_EQ(m.find().peers_size(), 3);

  Response st{NodeHeader{}, StoreResponse{{StoreStatus::accepted, StoreStatus::stale,
                                           StoreStatus::rejected, StoreStatus::full}}};
  EXPECT_EQ(decode_response(encode(st)).value(), st);
  Response ping{NodeHeader{true, {}}, PingResponse{}};
  EXPECT_EQ(decode_response(encode(ping)).value(), ping);
}

TEST(DhtMessages, RejectsMalformed) {
  EXPECT_EQ(decode_request(to_bytes("\xff\xff\xff")).error(), errc::protocol_violation);
  // No body.
  starling::pb::dht::Request empty;
  empty.mutable_sender();
  EXPECT_EQ(decode_request(raw(empty)).error(), errc::protocol_violation);
  // Target of the wrong length.
  starling::pb::dht::Request bad_target;
  bad_target.mutable_find()->add_targets("short");
  EXPECT_EQ(decode_request(raw(bad_target)).error(), errc::protocol_violation);
  // Sub-key bytes on a plain record; version out of range; ttl out of range.
  for (int variant = 0; variant < 3; ++variant) {
    starling::pb::dht::Request m;
    auto* r = m.mutable_store()->add_items()->add_records();
    if (variant == 0) r->set_subkey("x");
    if (variant == 1) r->set_version(kMaxWireVersion + 1);
    if (variant == 2) r->set_ttl_ms(kMaxWireMillis + 1);
    EXPECT_EQ(decode_request(raw(m)).error(), errc::protocol_violation) << variant;
  }
  // Peer index out of range; invalid peer id; unknown store status.
  starling::pb::dht::Response idx;
  idx.mutable_find()->add_results()->add_peers(0);
  EXPECT_EQ(decode_response(raw(idx)).error(), errc::protocol_violation);
  starling::pb::dht::Response badpeer;
  badpeer.mutable_find()->add_peers()->set_peer_id("garbage");
  EXPECT_FALSE(decode_response(raw(badpeer)));
  starling::pb::dht::Response status;
  status.mutable_store()->add_status(static_cast<starling::pb::dht::StoreStatus>(9));
  EXPECT_EQ(decode_response(raw(status)).error(), errc::protocol_violation);
}

TEST(DhtMessages, EnforcesLimits) {
  WireLimits lim;
  lim.max_message_bytes = 1000;
  lim.max_value_bytes = 10;
  lim.max_key_bytes = 5;
  lim.max_records_per_message = 3;
  lim.max_targets_per_find = 2;
  lim.max_addrs_per_peer = 1;
  lim.max_wire_elements = 50;
  auto store_with = [](std::size_t records, std::size_t value, std::size_t key) {
    StoreRequest s;
    StoreItem it{RecordKey(Bytes(key, 'k')), {}};
    for (std::size_t i = 0; i < records; ++i) {
      Record r;
      r.body.value = Bytes(value, 'v');
      r.ttl = Millis(1);
      it.records.push_back(r);
    }
    s.items.push_back(it);
    return Request{NodeHeader{}, s};
  };
  EXPECT_TRUE(decode_request(encode(store_with(3, 10, 5)), lim));
  EXPECT_EQ(decode_request(encode(store_with(4, 1, 5)), lim).error(), errc::too_large);
  EXPECT_EQ(decode_request(encode(store_with(1, 11, 5)), lim).error(), errc::too_large);
  EXPECT_EQ(decode_request(encode(store_with(1, 1, 6)), lim).error(), errc::too_large);
  EXPECT_EQ(
      decode_request(encode(store_with(3, 400, 5)), WireLimits{.max_message_bytes = 1000}).error(),
      errc::too_large);
  std::mt19937_64 rng(2);
  Request find{NodeHeader{},
               FindRequest{{DhtId::random(rng), DhtId::random(rng), DhtId::random(rng)}, false}};
  EXPECT_EQ(decode_request(encode(find), lim).error(), errc::too_large);
  Request addrs{NodeHeader{false, {to_bytes("a"), to_bytes("b")}}, PingRequest{}};
  EXPECT_EQ(decode_request(encode(addrs), lim).error(), errc::too_large);
  // Thousands of empty sub-messages in a small input are refused before protobuf builds them.
  starling::pb::dht::Request flood;
  auto* item = flood.mutable_store()->add_items();
  for (int i = 0; i < 200; ++i) item->add_records();
  auto e = decode_request(raw(flood), lim);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error(), errc::too_large);
  EXPECT_NE(e.error().context().find("elements"), std::string::npos);
}
