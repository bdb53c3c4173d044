// Accusation records in the DHT (acct_records.hpp) over the in-memory directory: every peer
// reads every accusation and judges it itself; true evidence bans the accused everywhere, a
// false accusation bans its accuser, malformed records are refused, evidence over one record
// travels in chunks, and a record read twice is judged once.
#include <gtest/gtest.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <optional>
#include <stdexcept>

#include "acct_fixture.hpp"
#include "starling/averaging/acct_records.hpp"
#include "starling/averaging/ban_gate.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace starling::averaging::acct;
using starling::averaging::acct::test::run;

namespace {

struct Peers {
  std::vector<crypto::KeyPair> keys;
  RoundInfo info;
  Hash32 rid{};
  explicit Peers(std::size_t n) {
    info.context = to_bytes("run/grads/1");
    for (std::size_t i = 0; i < n; ++i) {
      keys.push_back(crypto::KeyPair::generate());
      info.members.push_back(key_of(keys.back()));
    }
    rid = round_id(info);
  }
  Commitment commit(std::uint32_t s, const std::vector<float>& p0) const {
    Commitment c;
    c.round = rid;
    c.sender = s;
    c.parts = {hash_floats(p0)};
    sign(c, keys[s]);
    return c;
  }
  DataReceipt part(std::uint32_t s, const std::vector<float>& v) const {
    DataReceipt r;
    r.round = rid;
    r.signer = s;
    r.data_hash = hash_floats(v);
    sign(r, keys[s]);
    return r;
  }
};

}  // namespace

TEST(AcctRecords, EveryPeerJudgesEveryAccusation) {
  asio::io_context io;
  MemoryDirectory dir;
  Peers p(4);
  const std::vector<float> honest{1, 2, 3}, other{-1, -2, -3};
  const auto expires = WallClock::now() + std::chrono::minutes(10);
  // Peer 0 caught peer 1 sending a part other than its commitment.
  const auto c1 = p.commit(1, honest);
  const auto true_acc = make_accusation(part_mismatch(p.info, c1, p.part(1, other)), p.keys[0]);
  ASSERT_TRUE(run(io, publish_accusation(dir, "run", true_acc, expires)));
  // Peer 3 accuses peer 2 with a receipt it altered.
  const auto c2 = p.commit(2, honest);
  auto forged = p.part(2, honest);
  forged.data_hash = hash_floats(other);
  const auto false_acc = make_accusation(part_mismatch(p.info, c2, forged), p.keys[3]);
  ASSERT_TRUE(run(io, publish_accusation(dir, "run", false_acc, expires)));
  // Garbage under the same key, and another run's record.
  ASSERT_TRUE(run(io, dir.put(accusation_key("run"), to_bytes("junk"), to_bytes("junk"), expires)));
  ASSERT_TRUE(run(io, publish_accusation(dir, "other-run", true_acc, expires)));

  for (int peer = 0; peer < 2; ++peer) {
    BanList bans(CheckConfig{}, 10s);
    auto st = run(io, collect_accusations(dir, "run", bans, TimePoint{}));
    ASSERT_TRUE(st);
    EXPECT_EQ(st.value().records, 3u);
    EXPECT_EQ(st.value().malformed, 1u);
    EXPECT_EQ(st.value().verified, 1u);
    EXPECT_EQ(st.value().rejected, 1u);
    EXPECT_TRUE(bans.banned(p.info.members[1]));   // the cheater
    EXPECT_TRUE(bans.banned(p.info.members[3]));   // the false accuser
    EXPECT_FALSE(bans.banned(p.info.members[0]));  // the honest accuser
    EXPECT_FALSE(bans.banned(p.info.members[2]));  // the falsely accused
    // Read again: nothing judged twice.
    st = run(io, collect_accusations(dir, "run", bans, TimePoint{}));
    ASSERT_TRUE(st);
    EXPECT_EQ(st.value().verified + st.value().rejected, 0u);
  }
}

// Evidence over one record (here a result of 70000 values with a wrong signed norm, 280 KB)
// is published detached: its values in content-addressed chunks. A reader that cannot read a
// chunk yet leaves the record for later (nobody banned, nothing judged); once the chunks are
// there it judges the reassembled accusation like any other. Junk under a chunk's key is
// ignored (its hash does not match).
TEST(AcctRecords, OversizedEvidenceIsPublishedDetached) {
  asio::io_context io;
  MemoryDirectory dir;
  Peers p(2);
  std::vector<float> values(70000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 97) - 48.0f;
  DataReceipt res;
  res.kind = DataKind::result;
  res.round = p.rid;
  res.signer = 1;
  res.counted = {0, 1};
  res.data_hash = hash_floats(values);
  res.norm = 1.0;  // wrong
  sign(res, p.keys[1]);
  Evidence e;
  e.kind = EvidenceKind::bad_result_norm;
  e.info = p.info;
  e.receipts = {res};
  e.data = values;
  const auto a = make_accusation(e, p.keys[0]);
  ASSERT_GT(encode(a).size(), kMaxAccusationRecord);
  const auto expires = WallClock::now() + std::chrono::minutes(1);
  const auto d = detach(a);
  EXPECT_EQ(d.chunks1.size(), 2u);
  auto back = decode_detached(encode(d));
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back.value(), d);

  // The record alone, and junk under its first chunk's key: not judged yet.
  Bytes record = encode(d);
  ASSERT_TRUE(run(io, dir.put(accusation_key("run"), to_bytes("early"), record, expires)));
  ASSERT_TRUE(
      run(io, dir.put(chunk_key("run", d.chunks1[0]), to_bytes("junk"), Bytes(1000, 7), expires)));
  BanList bans(CheckConfig{}, 10s);
  auto st = run(io, collect_accusations(dir, "run", bans, TimePoint{}));
  ASSERT_TRUE(st);
  EXPECT_EQ(st.value().incomplete, 1u);
  EXPECT_EQ(st.value().verified + st.value().rejected + st.value().malformed, 0u);
  EXPECT_TRUE(bans.bans().empty());

  // Published with its chunks: judged, the owner banned, the accuser not.
  ASSERT_TRUE(run(io, publish_accusation(dir, "run", a, expires)));
  st = run(io, collect_accusations(dir, "run", bans, TimePoint{}));
  ASSERT_TRUE(st);
  EXPECT_EQ(st.value().verified, 1u);
  EXPECT_TRUE(bans.banned(p.info.members[1]));
  EXPECT_FALSE(bans.banned(p.info.members[0]));
  // A detached record whose chunk counts do not fit its values is refused.
  auto bad = d;
  bad.chunks1.pop_back();
  EXPECT_FALSE(decode_detached(encode(bad)));
}

namespace {

// Admits the peers of the keys it holds.
struct KeyGate final : PeerGate {
  std::vector<PubKey> keys;
  bool admits(const net::PeerId& peer) override {
    auto k = key_of_peer(peer);
    return k && std::find(keys.begin(), keys.end(), *k) != keys.end();
  }
  awaitable<bool> admit(const net::PeerId& peer) override { co_return admits(peer); }
};

}  // namespace

// A private run: a true accusation by a non-member is skipped (and read again later: once the
// accuser is admitted, it is judged).
TEST(AcctRecords, PrivateRunSkipsNonMembersAccusations) {
  asio::io_context io;
  MemoryDirectory dir;
  Peers p(3);
  const auto c1 = p.commit(1, {1, 2, 3});
  const auto acc = make_accusation(part_mismatch(p.info, c1, p.part(1, {3, 2, 1})), p.keys[0]);
  ASSERT_TRUE(
      run(io, publish_accusation(dir, "run", acc, WallClock::now() + std::chrono::minutes(1))));
  KeyGate gate;
  gate.keys = {p.info.members[1], p.info.members[2]};  // the accuser is not a member
  BanList bans(CheckConfig{}, 10s);
  auto st = run(io, collect_accusations(dir, "run", bans, TimePoint{}, &gate));
  ASSERT_TRUE(st);
  EXPECT_EQ(st.value().refused, 1u);
  EXPECT_TRUE(bans.bans().empty());
  gate.keys.push_back(p.info.members[0]);
  st = run(io, collect_accusations(dir, "run", bans, TimePoint{}, &gate));
  ASSERT_TRUE(st);
  EXPECT_EQ(st.value().verified, 1u);
  EXPECT_TRUE(bans.banned(p.info.members[1]));
}

// The state averager's gate: banned peers are refused, others go to the inner gate (or are
// admitted in an open run).
TEST(AcctRecords, BanGateRefusesBannedPeers) {
  asio::io_context io;
  Peers p(3);
  auto bans = std::make_shared<BanList>(CheckConfig{}, 10s);
  const auto c1 = p.commit(1, {1, 2, 3});
  ASSERT_TRUE(bans->add_evidence(part_mismatch(p.info, c1, p.part(1, {3, 2, 1})), TimePoint{}));
  auto inner = std::make_shared<KeyGate>();
  inner->keys = {p.info.members[1], p.info.members[2]};
  auto id = [&](int i) { return net::PeerId::from_public_key(p.keys[i].public_key()); };
  auto gated = ban_gate(bans, inner);
  EXPECT_FALSE(gated->admits(id(1)));  // banned
  EXPECT_TRUE(gated->admits(id(2)));
  EXPECT_FALSE(gated->admits(id(0)));  // not a member
  EXPECT_FALSE(run(io, gated->admit(id(1))));
  EXPECT_TRUE(run(io, gated->admit(id(2))));
  auto open = ban_gate(bans, nullptr);
  EXPECT_FALSE(open->admits(id(1)));
  EXPECT_TRUE(open->admits(id(0)));
  EXPECT_EQ(ban_gate(nullptr, inner), inner);
}
