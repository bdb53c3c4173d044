// DhtCore on small simulated networks and on its own: store/get, dictionaries merged across
// replicas, latest vs early stop, clock skew, shared gets, caching along the path, client
// mode, bootstrap errors, republishing, eviction pings, blacklist, invalid records.
#include <gtest/gtest.h>

#include <algorithm>

#include "sim_helpers.hpp"
#include "starling/dht/signing.hpp"

using namespace starling;
using namespace starling::dht;
using namespace starling::dht::test;

TEST(DhtCore, StoreThenEveryNodeGets) {
  SimOptions o;
  o.encode = true;  // through the real wire codec
  o.drop_rate = 0.02;
  auto net = network(40, o);
  const auto key = RecordKey::from_string("model/checkpoint");
  auto s = store(net, 3, key, {plain("v1", 100)});
  ASSERT_TRUE(s.status) << s.status.error().message();
  EXPECT_GE(s.stored, 3u);
  EXPECT_GE(holders(net, key), s.stored);  // a lost answer hides a replica from the count
  for (std::size_t i = 0; i < net.size(); ++i) {
    auto g = get(net, i, key);
    ASSERT_TRUE(g.status) << "node " << i << ": " << g.status.error().message();
    EXPECT_EQ(value_of(g), "v1");
  }
  auto missing = get(net, 5, RecordKey::from_string("nothing here"));
  ASSERT_FALSE(missing.status);
  EXPECT_EQ(missing.status.error(), errc::not_found);
}

TEST(DhtCore, DictionaryMergedAcrossReplicasAndLatest) {
  auto net = network(30);
  const auto key = RecordKey::from_string("group/members");
  // Two writers, two sub-keys, plus an update of one of them.
  ASSERT_TRUE(store(net, 1, key, {entry("alice", "a1", 100)}).status);
  ASSERT_TRUE(store(net, 2, key, {entry("bob", "b1", 100)}).status);
  ASSERT_TRUE(store(net, 3, key, {entry("alice", "a2", 200)}).status);
  // A newer "carol" lands on one replica only (as if other stores were lost).
  auto closest =
      net.run_op(0, [&](DhtCore& c, const Now& now) { return c.find_node(key.id(), now); });
  ASSERT_TRUE(closest.status);
  std::size_t lone = 0;
  for (std::size_t i = 0; i < net.size(); ++i)
    if (net.core(i).id() == closest.closest.front().id) lone = i;
  StoreRequest direct;
  direct.items.push_back(StoreItem{key, {entry("carol", "c1", 300)}});
  auto resp = net.core(lone).handle_request(net.core(9).peer(), Request{NodeHeader{}, direct},
                                            net.now_of(lone));
  ASSERT_EQ(std::get<StoreResponse>(resp.body).status.front(), StoreStatus::accepted);

  for (std::size_t i : {4u, 10u, 20u}) {
    auto g = get(net, i, key, /*latest=*/true);
    ASSERT_TRUE(g.status) << g.status.error().message();
    ASSERT_TRUE(g.value.is_dictionary());
    const auto& d = g.value.dictionary();
    ASSERT_EQ(d.size(), 3u) << "node " << i;
    EXPECT_EQ(as_string(d.at(SubKey::from_string("alice")).body.value), "a2");
    EXPECT_EQ(as_string(d.at(SubKey::from_string("bob")).body.value), "b1");
    EXPECT_EQ(as_string(d.at(SubKey::from_string("carol")).body.value), "c1");
  }
  // A plain write newer than every entry replaces the dictionary everywhere it lands.
  ASSERT_TRUE(store(net, 5, key, {plain("reset", 400)}).status);
  auto g = get(net, 6, key, true);
  ASSERT_TRUE(g.status);
  EXPECT_FALSE(g.value.is_dictionary());
  EXPECT_EQ(value_of(g), "reset");
}

TEST(DhtCore, EarlyDictionaryGetMergesAQuorumOfAnswers) {
  auto net = network(40);
  // One entry on each of the three closest nodes only (as if the other stores were lost).
  // Returns a reader that holds none of them.
  auto scatter = [&](const RecordKey& key) {
    auto closest =
        net.run_op(0, [&](DhtCore& c, const Now& now) { return c.find_node(key.id(), now); });
    EXPECT_GE(closest.closest.size(), 3u);
    const char* names[] = {"x", "y", "z"};
    std::vector<std::size_t> held_by;
    for (std::size_t r = 0; r < 3; ++r) {
      std::size_t node = 0;
      for (std::size_t i = 0; i < net.size(); ++i)
        if (net.core(i).id() == closest.closest[r].id) node = i;
      held_by.push_back(node);
      StoreRequest direct;
      direct.items.push_back(StoreItem{key, {entry(names[r], names[r], 100)}});
      net.core(node).handle_request(net.core(0).peer(), Request{NodeHeader{}, direct},
                                    net.now_of(node));
    }
    std::size_t reader = 1;
    while (std::find(held_by.begin(), held_by.end(), reader) != held_by.end()) ++reader;
    return reader;
  };
  // Default: not `latest`, stops after 3 answers carrying values, merged.
  const auto k1 = RecordKey::from_string("scattered 1");
  auto g = get(net, scatter(k1), k1);
  ASSERT_TRUE(g.status) << g.status.error().message();
  EXPECT_EQ(g.value.dictionary().size(), 3u);
  // With a quorum of 1 it stops at the first answer.
  const auto k2 = RecordKey::from_string("scattered 2");
  auto one = net.run_op(scatter(k2), [&](DhtCore& c, const Now& now) {
    return c.get(k2, GetOptions{false, 1}, now);
  });
  ASSERT_TRUE(one.status) << one.status.error().message();
  EXPECT_EQ(one.value.dictionary().size(), 1u);
}

TEST(DhtCore, EarlyStopUsesFewerRequestsThanLatest) {
  auto net = network(60);
  const auto key = RecordKey::from_string("early");
  ASSERT_TRUE(store(net, 0, key, {plain("x", 1)}).status);
  std::size_t early = 0, full = 0;
  for (std::size_t i = 10; i < 30; ++i) {
    early += get(net, i, key, false).stats.requests;
    full += get(net, i + 20, key, true).stats.requests;
  }
  EXPECT_LT(early, full);
}

TEST(DhtCore, ClockSkewDoesNotChangeExpiry) {
  // Nodes' wall clocks are spread over +-5 minutes; expiry is relative, so all agree.
  SimOptions o;
  o.config = small_config();
  SimNetwork net(o);
  for (int i = 0; i < 20; ++i) net.add_node(std::nullopt, std::chrono::minutes((i % 11) - 5));
  for (std::size_t i = 1; i < net.size(); ++i) ASSERT_TRUE(net.join(i, {0}).status);
  net.run_for(10s);
  const auto key = RecordKey::from_string("ttl");
  // Node 0 is 5 minutes behind; store a 60 s value.
  ASSERT_TRUE(store(net, 0, key, {plain("v", 1, 60s)}).status);
  net.run_for(30s);
  // Node 5 (at +0) and node 10 (at +5 min) see about 30 s left.
  for (std::size_t i : {5u, 10u}) {
    auto g = get(net, i, key);
    ASSERT_TRUE(g.status) << g.status.error().message();
    const auto left = g.value.plain()->deadline - net.time();
    // Equal to the writer's view up to message latencies (40 ms per hop here).
    EXPECT_LE(left, 30s + 200ms);
    EXPECT_GE(left, 29s);
  }
  net.run_for(31s);
  for (std::size_t i = 0; i < net.size(); ++i) {
    auto g = get(net, i, key);
    EXPECT_EQ(g.status.error(), errc::not_found) << "node " << i;
    EXPECT_TRUE(net.core(i).records().records(key.id(), net.time()).empty());
  }
  // Signed records written by a node 4 minutes ahead are accepted by one 5 minutes behind.
  const auto& owner = net.key(9);
  const auto skey = RecordKey::from_string("signed/" + owner_marker(net.core(9).peer()));
  const auto version = static_cast<std::uint64_t>(wall_micros(net.now_of(9).wall));
  auto rec = make_signed_record(owner, skey, std::nullopt, to_bytes("s"), 60s, version);
  ASSERT_TRUE(store(net, 9, skey, {rec}).status);
  auto g = get(net, 0, skey);
  ASSERT_TRUE(g.status) << g.status.error().message();
  EXPECT_EQ(value_of(g), "s");
}

TEST(DhtCore, ConcurrentGetsShareOneLookup) {
  auto net = network(30);
  const auto key = RecordKey::from_string("shared");
  ASSERT_TRUE(store(net, 0, key, {plain("v", 1)}).status);
  std::size_t reader = 1;
  while (!net.core(reader).records().records(key.id(), net.time()).empty()) ++reader;
  const auto before = net.core(reader).active_operations();
  std::vector<OpId> ids;
  for (int i = 0; i < 3; ++i)
    ids.push_back(
        net.start_op(reader, [&](DhtCore& c, const Now& now) { return c.get(key, {}, now); }));
  EXPECT_EQ(net.core(reader).active_operations(), before + 1);
  // A `latest` get cannot join a non-latest search.
  ids.push_back(
      net.start_op(reader, [&](DhtCore& c, const Now& now) { return c.get(key, {true}, now); }));
  EXPECT_EQ(net.core(reader).active_operations(), before + 2);
  std::vector<OpResult> rs;
  for (auto id : ids) rs.push_back(net.wait_op(reader, id));
  for (const auto& r : rs) EXPECT_EQ(value_of(r), "v");
  EXPECT_EQ(rs[0].stats.requests, rs[1].stats.requests);
  EXPECT_EQ(rs[0].stats.requests, rs[2].stats.requests);
}

TEST(DhtCore, CachesAlongThePath) {
  auto net = network(80, one_replica_options());
  const auto key = RecordKey::from_string("cache me");
  ASSERT_TRUE(store(net, 0, key, {plain("v", 1)}, StoreOptions{1, false}).status);
  const std::size_t before = holders(net, key);
  std::size_t got = 0;
  for (std::size_t i = 1; i < 40; ++i) got += value_of(get(net, i, key)) == "v";
  net.run_for(5s);
  EXPECT_EQ(got, 39u);
  EXPECT_GT(holders(net, key), before);
}

TEST(DhtCore, ClientsStoreAndGetButNeverEnterRoutingTables) {
  auto net = network(25);
  DhtConfig cc = small_config();
  cc.client_mode = true;
  const std::size_t client = net.add_node(cc);
  ASSERT_TRUE(net.join(client, {0}).status);
  const auto key = RecordKey::from_string("from a client");
  auto s = store(net, client, key, {plain("c", 1)});
  ASSERT_TRUE(s.status) << s.status.error().message();
  auto g = get(net, client, key);
  EXPECT_EQ(value_of(g), "c");
  EXPECT_EQ(value_of(get(net, 7, key)), "c");
  net.run_for(1min);
  for (std::size_t i = 0; i < net.size(); ++i) {
    EXPECT_FALSE(net.core(i).routing().contains(net.core(client).id())) << "node " << i;
  }
  EXPECT_EQ(net.core(client).records().key_count(), 0u);
  EXPECT_GT(net.core(client).routing().size(), 0u);
}

TEST(DhtCore, BootstrapFailsClearlyWhenNoSeedAnswers) {
  SimNetwork net(SimOptions{});
  net.add_node();
  net.add_node();
  const std::size_t lonely = net.add_node();
  net.kill(0);
  net.kill(1);
  auto r = net.join(lonely, {0, 1});
  ASSERT_FALSE(r.status);
  EXPECT_EQ(r.status.error(), errc::unavailable);
  EXPECT_NE(r.status.error().message().find("none of the 2 initial peers answered"),
            std::string::npos)
      << r.status.error().message();
  auto none = net.run_op(lonely, [](DhtCore& c, const Now& now) { return c.bootstrap({}, now); });
  EXPECT_EQ(none.status.error(), errc::unavailable);
}

TEST(DhtCore, RepublishesOwnRecordsToNewClosestNodes) {
  auto net = network(40);
  const auto key = RecordKey::from_string("keep me alive");
  // A writer that is not among the closest nodes.
  auto s = store(net, 0, key, {plain("v", 1, std::chrono::hours(1))});
  ASSERT_TRUE(s.status);
  ASSERT_TRUE(net.core(0).records().records(key.id(), net.time()).empty())
      << "pick another key: the writer is a replica";
  for (std::size_t i = 1; i < net.size(); ++i)
    if (!net.core(i).records().records(key.id(), net.time()).empty()) net.kill(i);
  EXPECT_EQ(holders(net, key), 0u);
  std::size_t reader = 1;
  while (!net.alive(reader)) ++reader;
  EXPECT_EQ(get(net, reader, key).status.error(), errc::not_found);
  net.run_for(net.core(0).config().republish_interval + 10s);
  EXPECT_GE(holders(net, key), 2u);
  EXPECT_EQ(value_of(get(net, reader, key)), "v");
}

TEST(DhtCore, RejectsInvalidRecordsAtOriginAndFromPeers) {
  auto net = network(10);
  const auto& owner = net.key(2);
  const auto key = RecordKey::from_string("owned/" + owner_marker(net.core(2).peer()));
  // Unsigned write to an owned key: refused locally, nothing sent.
  auto s = store(net, 4, key, {plain("unsigned", 1)});
  ASSERT_FALSE(s.status);
  EXPECT_EQ(s.status.error(), dht_errc::missing_signature);
  EXPECT_EQ(s.stats.requests, 0u);
  EXPECT_FALSE(net.core(4).poll_request().has_value());
  // Sent directly by a peer: rejected, not stored.
  StoreRequest direct;
  auto forged = make_signed_record(net.key(4), key, std::nullopt, to_bytes("forged"), 60s,
                                   static_cast<std::uint64_t>(wall_micros(net.now_of(4).wall)));
  direct.items.push_back(StoreItem{key, {forged, plain("unsigned", 2)}});
  auto resp =
      net.core(5).handle_request(net.core(4).peer(), Request{NodeHeader{}, direct}, net.now_of(5));
  EXPECT_EQ(std::get<StoreResponse>(resp.body).status,
            (std::vector<StoreStatus>{StoreStatus::rejected, StoreStatus::rejected}));
  EXPECT_EQ(net.core(5).records().key_count(), 0u);
  // The owner's signed write works, and a replay of an older signed version is stale.
  const auto v1 = static_cast<std::uint64_t>(wall_micros(net.now_of(2).wall));
  auto old = make_signed_record(owner, key, std::nullopt, to_bytes("old"), 10min, v1);
  auto fresh = make_signed_record(owner, key, std::nullopt, to_bytes("new"), 10min, v1 + 1);
  ASSERT_TRUE(store(net, 2, key, {fresh}).status);
  auto replay = store(net, 4, key, {old});
  ASSERT_FALSE(replay.status);
  EXPECT_EQ(replay.status.error(), dht_errc::stale);
  EXPECT_EQ(value_of(get(net, 7, key, true)), "new");
}

TEST(DhtCore, IgnoresForgedRecordsInAnswers) {
  // One core, driven by hand: the only peer answers a get with a forged owned record.
  const auto me = crypto::KeyPair::generate();
  const auto other = crypto::KeyPair::generate();
  const auto owner = crypto::KeyPair::generate();
  const auto owner_peer = net::PeerId::from_public_key(owner.public_key());
  DhtCore core(DhtConfig{}, net::PeerId::from_public_key(me.public_key()),
               ValidatorChain::standard(), 1);
  const Now now{TimePoint{} + 1h, WallTime(std::chrono::seconds(1'700'000'000))};
  const auto key = RecordKey::from_string("k" + owner_marker(owner_peer));
  const auto op = core.get(key, {}, now);
  // Nobody known: fails at once.
  auto r = core.poll_result();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->id, op);
  EXPECT_EQ(r->status.error(), errc::unavailable);
  // Learn one peer, then get again.
  const auto peer = net::PeerId::from_public_key(other.public_key());
  core.handle_request(peer, Request{NodeHeader{false, {to_bytes("a")}}, PingRequest{}}, now);
  core.get(key, {}, now);
  auto out = core.poll_request();
  ASSERT_TRUE(out);
  auto forged = make_signed_record(other, key, std::nullopt, to_bytes("evil"), 60s,
                                   static_cast<std::uint64_t>(wall_micros(now.wall)));
  core.on_response(out->id, Response{NodeHeader{}, FindResponse{{FindResult{{forged}, {}}}}}, now);
  r = core.poll_result();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status.error(), errc::not_found);
  EXPECT_TRUE(r->value.empty());
  EXPECT_FALSE(core.poll_request());  // nothing cached or forwarded
}

TEST(DhtCore, FullBucketPingsLeastRecentlySeenAndEvictsOnFailure) {
  DhtConfig cfg;
  cfg.k = 2;
  cfg.split_depth_modulo = 0;
  const auto me = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
  DhtCore core(cfg, me, ValidatorChain::standard(), 1);
  const Now now{TimePoint{} + 1h, WallTime{}};
  const DhtId self = core.id();
  // Peers whose ids fall on the far side (first bit differs from ours).
  std::vector<net::PeerId> far;
  while (far.size() < 5) {
    auto p = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
    if (DhtId::of_peer(p).bit(0) != self.bit(0)) far.push_back(p);
  }
  std::optional<net::PeerId> near;
  while (!near) {
    auto p = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
    if (DhtId::of_peer(p).bit(0) == self.bit(0)) near = p;
  }
  auto hello = [&](const net::PeerId& p, Duration at) {
    core.handle_request(p, Request{NodeHeader{false, {to_bytes("x")}}, PingRequest{}},
                        Now{now.mono + at, now.wall});
  };
  hello(*near, 0s);
  hello(far[0], 1s);
  hello(far[1], 2s);  // splits the root; the far bucket holds far[0], far[1]
  EXPECT_FALSE(core.poll_request());
  hello(far[2], 3s);  // full: far[2] waits, far[0] (least recently seen) is pinged
  auto ping = core.poll_request();
  ASSERT_TRUE(ping);
  EXPECT_EQ(ping->to.peer, far[0]);
  EXPECT_TRUE(std::holds_alternative<PingRequest>(ping->request.body));
  core.on_failure(ping->id, make_error(errc::timeout), Now{now.mono + 4s, now.wall});
  EXPECT_FALSE(core.routing().contains(DhtId::of_peer(far[0])));
  EXPECT_TRUE(core.routing().contains(DhtId::of_peer(far[2])));
  // Next newcomer: far[1] is pinged and answers, so it stays and the newcomer does not enter.
  hello(far[3], 5s);
  ping = core.poll_request();
  ASSERT_TRUE(ping);
  EXPECT_EQ(ping->to.peer, far[1]);
  core.on_response(ping->id, Response{NodeHeader{}, PingResponse{}}, Now{now.mono + 6s, now.wall});
  EXPECT_TRUE(core.routing().contains(DhtId::of_peer(far[1])));
  EXPECT_FALSE(core.routing().contains(DhtId::of_peer(far[3])));
  // far[0] failed once: blacklisted for 5 s, then 10 s after a second failure.
  EXPECT_TRUE(core.blacklist().blocked(DhtId::of_peer(far[0]), now.mono + 8s));
  EXPECT_FALSE(core.blacklist().blocked(DhtId::of_peer(far[0]), now.mono + 10s));
  EXPECT_EQ(core.blacklist().failures(DhtId::of_peer(far[0])), 1u);
}

TEST(DhtCore, UnansweredRequestsTimeOutByThemselves) {
  const auto me = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
  const auto peer = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
  DhtConfig cfg;
  DhtCore core(cfg, me, ValidatorChain::standard(), 1);
  const Now now{TimePoint{} + 1h, WallTime{}};
  const auto op = core.bootstrap({Contact::of(peer, {to_bytes("a")})}, now);
  auto out = core.poll_request();
  ASSERT_TRUE(out);
  EXPECT_EQ(out->deadline, now.mono + cfg.request_timeout);
  EXPECT_LE(core.next_wakeup(), now.mono + cfg.slow_request);
  core.tick(Now{out->deadline - 1ms, now.wall});
  EXPECT_FALSE(core.poll_result());
  core.tick(Now{out->deadline, now.wall});
  auto r = core.poll_result();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->id, op);
  EXPECT_EQ(r->status.error(), errc::unavailable);
  // A late answer is ignored.
  core.on_response(out->id, Response{NodeHeader{}, FindResponse{{FindResult{}}}}, now);
  EXPECT_FALSE(core.poll_result());
  EXPECT_EQ(core.pending_requests(), 0u);
}
