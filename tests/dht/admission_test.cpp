// Admission of lookup-learned nodes (DhtConfig::admit_learned): a node only named in a lookup
// answer is pinged in the background and enters the routing table when it answers as a
// server; a client's answer keeps it out; a failed ping blacklists it; a closed admission
// (the node's connection bound) sends nothing until reopened.
#include <gtest/gtest.h>

#include "starling/crypto/keys.hpp"
#include "starling/dht/core.hpp"

using namespace starling;
using namespace starling::dht;

namespace {
net::PeerId new_peer() {
  return net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
}

struct Sent {
  std::vector<OutgoingRequest> pings, finds;
};

Sent drain(DhtCore& core) {
  Sent s;
  while (auto r = core.poll_request()) {
    if (std::holds_alternative<PingRequest>(r->request.body))
      s.pings.push_back(std::move(*r));
    else if (std::holds_alternative<FindRequest>(r->request.body))
      s.finds.push_back(std::move(*r));
  }
  return s;
}

NodeHeader server_header(const std::string& addr) {
  return NodeHeader{false, {to_bytes(addr)}};
}
}  // namespace

TEST(DhtAdmission, LearnedNodesArePingedAndEnterOnlyWhenTheyAnswerAsServers) {
  DhtConfig cfg;
  cfg.admit_learned = true;
  cfg.alpha = 1;
  cfg.beam_width = 1;  // the lookup asks only the closest candidate
  DhtCore core(cfg, new_peer(), ValidatorChain::standard(), 1);
  const Now now{TimePoint{} + 1h, WallTime{}};
  const auto seed = new_peer();
  core.handle_request(seed, Request{server_header("seed"), PingRequest{}}, now);
  ASSERT_TRUE(core.routing().contains(DhtId::of_peer(seed)));

  // Learned peers: a (the lookup's target, so the lookup asks it), b (answers as a client),
  // c (answers as a server), d (fails).
  const auto a = new_peer(), b = new_peer(), c = new_peer(), d = new_peer();
  const auto op = core.find_node(DhtId::of_peer(a), now);
  auto sent = drain(core);
  ASSERT_EQ(sent.finds.size(), 1u);
  EXPECT_EQ(sent.finds[0].to.peer, seed);
  FindResult learned;
  for (const auto* p : {&a, &b, &c, &d}) learned.peers.push_back(PeerInfo{*p, {to_bytes("x")}});
  core.on_response(sent.finds[0].id, Response{server_header("seed"), FindResponse{{learned}}}, now);
  sent = drain(core);
  // The pings wait while the caller's lookup runs (their dials would delay its answers).
  EXPECT_TRUE(sent.pings.empty());
  EXPECT_EQ(core.admissions_waiting(), 4u);
  ASSERT_EQ(sent.finds.size(), 1u);
  EXPECT_EQ(sent.finds[0].to.peer, a);
  EXPECT_FALSE(core.routing().contains(DhtId::of_peer(c)));  // learned is not admitted
  core.on_response(sent.finds[0].id, Response{server_header("a"), FindResponse{{FindResult{}}}},
                   now);
  auto r = core.poll_result();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->id, op);
  EXPECT_TRUE(core.routing().contains(DhtId::of_peer(a)));  // it answered the lookup
  // The lookup ended: admit_parallel = 2 pings, to b and c (a is in the table already).
  sent = drain(core);
  ASSERT_EQ(sent.pings.size(), 2u);
  EXPECT_EQ(sent.pings[0].to.peer, b);
  EXPECT_EQ(sent.pings[1].to.peer, c);
  EXPECT_EQ(core.admissions_sent(), 2u);

  // Closed admission (the node's connection bound): d waits when a slot frees up.
  core.set_admission_open(false, now);
  core.on_response(sent.pings[0].id, Response{NodeHeader{true, {}}, PingResponse{}}, now);
  core.on_response(sent.pings[1].id, Response{server_header("c"), PingResponse{}}, now);
  EXPECT_FALSE(core.routing().contains(DhtId::of_peer(b)));  // a client never enters
  EXPECT_TRUE(core.routing().contains(DhtId::of_peer(c)));
  ASSERT_TRUE(core.routing().find(DhtId::of_peer(c)));
  EXPECT_EQ(core.routing().find(DhtId::of_peer(c))->contact.addrs, server_header("c").addrs);
  sent = drain(core);
  EXPECT_TRUE(sent.pings.empty());
  EXPECT_EQ(core.admissions_waiting(), 1u);
  core.set_admission_open(true, now);
  sent = drain(core);
  ASSERT_EQ(sent.pings.size(), 1u);
  EXPECT_EQ(sent.pings[0].to.peer, d);
  core.on_failure(sent.pings[0].id, make_error(errc::timeout), now);
  EXPECT_FALSE(core.routing().contains(DhtId::of_peer(d)));
  EXPECT_TRUE(core.blacklist().blocked(DhtId::of_peer(d), now.mono));
  EXPECT_EQ(core.admissions_waiting(), 0u);
  EXPECT_EQ(core.pending_requests(), 0u);

  // Learned again: nodes in the table or blacklisted are not pinged again.
  const auto op2 = core.find_node(DhtId::of_peer(c), now);
  sent = drain(core);
  ASSERT_EQ(sent.finds.size(), 1u);
  core.on_response(sent.finds[0].id, Response{server_header("c"), FindResponse{{learned}}}, now);
  sent = drain(core);
  ASSERT_TRUE(core.poll_result());
  sent = drain(core);
  for (const auto& p : sent.pings) EXPECT_EQ(p.to.peer, b) << "only the client is asked again";
  (void)op2;
}

TEST(DhtAdmission, OffSendsNoPings) {
  DhtConfig cfg;
  cfg.admit_learned = false;
  DhtCore core(cfg, new_peer(), ValidatorChain::standard(), 1);
  const Now now{TimePoint{} + 1h, WallTime{}};
  const auto seed = new_peer();
  core.handle_request(seed, Request{server_header("seed"), PingRequest{}}, now);
  core.find_node(DhtId::of_peer(new_peer()), now);
  auto sent = drain(core);
  ASSERT_EQ(sent.finds.size(), 1u);
  FindResult learned;
  for (int i = 0; i < 5; ++i) learned.peers.push_back(PeerInfo{new_peer(), {to_bytes("x")}});
  core.on_response(sent.finds[0].id, Response{server_header("seed"), FindResponse{{learned}}}, now);
  EXPECT_TRUE(drain(core).pings.empty());
  EXPECT_EQ(core.admissions_sent(), 0u);
}
