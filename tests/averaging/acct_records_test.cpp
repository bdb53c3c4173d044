// Accusation records in the DHT (acct_records.hpp) over the in-memory directory: every peer
// reads every accusation and judges it itself; true evidence bans the accused everywhere, a
// false accusation bans its accuser, malformed records and oversized evidence are refused,
// and a record read twice is judged once.
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <optional>
#include <stdexcept>

#include "starling/averaging/acct_records.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace starling::averaging::acct;

namespace {

template <class T>
awaitable<void> store(awaitable<T> a, std::optional<T>* out) {
  out->emplace(co_await std::move(a));
}

// Runs `a` to completion on `io` (the in-memory directory completes without waiting).
template <class T>
T run(asio::io_context& io, awaitable<T> a) {
  std::optional<T> out;
  asio::co_spawn(io, store(std::move(a), &out), asio::detached);
  io.restart();
  io.run();
  if (!out) throw std::runtime_error("coroutine did not finish");
  return std::move(*out);
}

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

TEST(AcctRecords, OversizedEvidenceIsNotPublished) {
  asio::io_context io;
  MemoryDirectory dir;
  Peers p(2);
  Evidence e;
  e.kind = EvidenceKind::false_report;
  e.data.assign(70000, 1.0f);  // 280 KB of values
  const auto a = make_accusation(e, p.keys[0]);
  auto r = run(io, publish_accusation(dir, "run", a, WallClock::now() + std::chrono::minutes(1)));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), make_error_code(errc::too_large));
}
