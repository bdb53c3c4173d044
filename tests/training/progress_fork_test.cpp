// The progress core's defences against forked parameters, with simulated time: state digests
// in records (peers at one epoch with other parameters download the digest most peers hold),
// no step alone before the others were looked for (startup grace, a fetch after every epoch
// change), and round members presumed at the new epoch when rounds are faster than records.
#include <gtest/gtest.h>

#include <cmath>

#include "progress_support.hpp"

using namespace starling;
using namespace starling::training;
using progress_support::config;
using progress_support::make_peer;
using progress_support::t0;

namespace {

// A record of a peer at `epoch` holding parameters with `digest`.
PeerProgress rec(std::uint64_t epoch, std::uint64_t digest, std::uint64_t samples = 0,
                 std::uint64_t seq = 1) {
  auto p = progress_support::rec(epoch, samples, 10, seq);
  p.digest = digest;
  return p;
}

}  // namespace

TEST(StateDigest, EqualBytesEqualDigestOtherwiseDifferentNeverZero) {
  std::vector<float> a(1001, 0.25f), b = a;
  auto digest = [](const std::vector<float>& v) {
    StateDigest d;
    d.update(v.data(), v.size() * sizeof(float));
    return d.value();
  };
  EXPECT_EQ(digest(a), digest(b));
  b[1000] = std::nextafter(0.25f, 1.0f);  // one ulp in the last element
  EXPECT_NE(digest(a), digest(b));
  b = a;
  b[0] = -0.25f;
  EXPECT_NE(digest(a), digest(b));
  EXPECT_NE(digest({}), 0u);
  // Split updates over the same bytes give the same digest.
  StateDigest s;
  s.update(a.data(), 500 * sizeof(float));
  s.update(a.data() + 500, 501 * sizeof(float));
  EXPECT_EQ(s.value(), digest(a));
}

TEST(ProgressRecord, DigestRoundTripsAndOldRecordsParse) {
  auto p = rec(3, 0xDEADBEEF12345678ULL);
  auto d = decode_progress(encode_progress(p));
  ASSERT_TRUE(d);
  EXPECT_EQ(d.value().digest, 0xDEADBEEF12345678ULL);
  // A record without the field (an older publisher): digest 0, unknown.
  auto old = decode_progress(encode_progress(rec(3, 0)));
  ASSERT_TRUE(old);
  EXPECT_EQ(old.value().digest, 0u);
}

// Three peers at epoch 4, two holding digest 7, one holding 9: the one downloads the 7 state,
// the two keep training. Peers at other epochs and records without a digest do not vote.
TEST(ProgressTracker, ForkAtOneEpochMajorityDigestWins) {
  auto now = t0();
  auto a = make_peer(), b = make_peer(), c = make_peer();
  auto tracker = [&](const net::PeerId& self, std::uint64_t digest) {
    ProgressTracker t(self, config(1000));
    t.set_epoch(4);
    t.set_digest(digest);
    return t;
  };
  auto ta = tracker(a, 7), tb = tracker(b, 7), tc = tracker(c, 9);
  for (auto* t : {&ta, &tb, &tc}) {
    t->observe(a, rec(4, 7), 0s, now);
    t->observe(b, rec(4, 7), 0s, now);
    t->observe(c, rec(4, 9), 0s, now);
    t->observe(make_peer(), rec(3, 9), 0s, now);  // behind: not a vote
    t->observe(make_peer(), rec(4, 0), 0s, now);  // no digest: not a vote
  }
  auto dc = tc.decide(now);
  EXPECT_EQ(dc.action, Action::download_state);
  EXPECT_EQ(dc.want_digest, 7u);
  EXPECT_NE(ta.decide(now).action, Action::download_state);
  EXPECT_NE(tb.decide(now).action, Action::download_state);
  // After the download, c holds 7 too: no more fork.
  tc.set_epoch(4);
  tc.set_digest(7);
  EXPECT_NE(tc.decide(now).action, Action::download_state);
  // The own record carries the digest; a changed digest is published at once.
  EXPECT_EQ(tc.make_record(now, 60s).digest, 7u);
  EXPECT_FALSE(tc.should_publish(now));
  tc.set_digest(8);
  EXPECT_TRUE(tc.should_publish(now));
}

// Two peers at one epoch with different digests: a tie, the larger digest wins on both sides.
TEST(ProgressTracker, ForkTieLargerDigestWins) {
  auto now = t0();
  auto a = make_peer(), b = make_peer();
  ProgressTracker ta(a, config(1000)), tb(b, config(1000));
  ta.set_digest(100);
  tb.set_digest(200);
  ta.observe(b, rec(0, 200), 0s, now);
  tb.observe(a, rec(0, 100), 0s, now);
  auto da = ta.decide(now);
  EXPECT_EQ(da.action, Action::download_state);
  EXPECT_EQ(da.want_digest, 200u);
  EXPECT_NE(tb.decide(now).action, Action::download_state);
  // A stale record no longer votes.
  EXPECT_NE(ta.decide(now + 31s).action, Action::download_state);
}

// A networked peer never steps alone before the startup grace has passed and a fetch begun
// after it found nobody, nor after an epoch change before a fetch begun after that change.
TEST(ProgressTracker, ConfirmAloneBeforeSteppingAlone) {
  auto cfg = config(100);
  cfg.confirm_alone = true;
  cfg.startup_grace = 5s;
  ProgressTracker t(make_peer(), cfg);
  auto now = t0();
  t.start(now);
  t.report_samples(100, 1s);
  t.fetched(now, t.epoch_generation());  // found nobody, but during the grace
  EXPECT_EQ(t.decide(now + 1s).action, Action::accumulate);
  EXPECT_EQ(t.decide(now + 6s).action, Action::accumulate);
  t.fetched(now + 6s, t.epoch_generation());
  EXPECT_EQ(t.decide(now + 6s).action, Action::step_alone);
  t.set_epoch(1);
  t.report_samples(100, 1s);
  // A fetch that began before the epoch change does not confirm.
  const auto gen_before = t.epoch_generation() - 1;
  t.fetched(now + 7s, gen_before);
  EXPECT_EQ(t.decide(now + 7s).action, Action::accumulate);
  t.fetched(now + 7s, t.epoch_generation());
  EXPECT_EQ(t.decide(now + 7s).action, Action::step_alone);
  // Without confirm_alone (training alone, no network) there is nothing to wait for.
  ProgressTracker alone(make_peer(), config(100));
  alone.report_samples(100, 1s);
  EXPECT_EQ(alone.decide(now).action, Action::step_alone);
}

// Peers started in the same instant: the first fetch shows only the records published before
// it, and a majority of that partial view (2 of 2 here, while 5 started) would let two
// disjoint groups both average epoch 0. No round before a fetch begun startup_grace after
// start(); by then every peer started with this one is in the view and counts in the majority.
TEST(ProgressTracker, NoRoundBeforeTheViewSettledAtStart) {
  auto cfg = config(100);
  cfg.confirm_alone = true;
  cfg.startup_grace = 2s;
  ProgressTracker t(make_peer(), cfg);
  auto now = t0();
  t.start(now);
  t.report_samples(100, 1s);
  t.observe(make_peer(), rec(0, 0, 50, 2), 0s, now);  // the one record published so far
  t.fetched(now, t.epoch_generation());
  EXPECT_EQ(t.decide(now).action, Action::accumulate);
  EXPECT_EQ(t.decide(now + 3s).action, Action::accumulate);  // no fetch begun after the grace
  for (int i = 0; i < 3; ++i) t.observe(make_peer(), rec(0, 0, 50, 2), 0s, now + 2s);
  t.fetched(now + 2s, t.epoch_generation());
  auto d = t.decide(now + 2s);
  EXPECT_EQ(d.action, Action::average_and_step);
  EXPECT_EQ(d.view.majority_base, 5u);
  // Settled once: later epochs need no new wait.
  t.set_epoch(1);
  t.report_samples(100, 1s);
  for (int i = 0; i < 4; ++i) t.observe(make_peer(), rec(1, 0, 50, 3), 0s, now + 4s);
  EXPECT_EQ(t.decide(now + 4s).action, Action::average_and_step);
  // A peer that downloaded a running collaboration's state has seen it: no wait.
  ProgressTracker joiner(make_peer(), cfg);
  joiner.start(now);
  joiner.set_epoch(7);
  joiner.state_downloaded();
  joiner.report_samples(100, 1s);
  joiner.observe(make_peer(), rec(7, 0, 50, 2), 0s, now);
  EXPECT_EQ(joiner.decide(now).action, Action::average_and_step);
}

// A failed round disturbs the view (a partner whose publishing stalled on a dead node looks
// gone for a while): a networked peer does not step alone until stale_after has passed since
// the failure and a fetch begun after that found nobody; a partner seen again in the
// meantime means averaging, not stepping alone.
TEST(ProgressTracker, NoStepAloneRightAfterAFailedRound) {
  auto cfg = config(100);
  cfg.confirm_alone = true;
  cfg.stale_after = 4s;
  ProgressTracker t(make_peer(), cfg);
  auto now = t0();
  t.start(now);  // no startup grace
  t.report_samples(100, 1s);
  t.fetched(now, t.epoch_generation());                 // found nobody
  ASSERT_EQ(t.decide(now).action, Action::step_alone);  // alone: confirmed
  EXPECT_TRUE(t.may_step_alone(now));
  t.round_failed(now);
  t.fetched(now + 1s, t.epoch_generation());  // found nobody, within the hold
  EXPECT_EQ(t.decide(now + 1s).action, Action::accumulate);
  EXPECT_FALSE(t.may_step_alone(now + 1s));
  EXPECT_EQ(t.decide(now + 5s).action, Action::accumulate);  // no fetch since the hold ended
  // The partner shows again: average with it.
  auto partner = make_peer();
  t.observe(partner, rec(0, 0, 50, 2), 0s, now + 5s);
  EXPECT_EQ(t.decide(now + 5s).action, Action::average_and_step);
  // It is gone for good: after its record expired, a fetch begun after the hold confirms.
  t.fetched(now + 40s, t.epoch_generation());
  EXPECT_EQ(t.decide(now + 40s).action, Action::step_alone);
}

// Peers past an epoch: only records at a later epoch (and this peer if it is later) count.
TEST(ProgressTracker, PeersAheadCountsOnlyLaterEpochs) {
  auto now = t0();
  ProgressTracker t(make_peer(), config(100));
  t.set_epoch(4);
  t.observe(make_peer(), rec(3, 1, 0, 1), 0s, now);
  t.observe(make_peer(), rec(4, 1, 0, 1), 0s, now);
  t.observe(make_peer(), rec(5, 1, 0, 1), 0s, now);
  t.observe(make_peer(), rec(7, 1, 0, 1), 0s, now);
  EXPECT_EQ(t.peers_ahead(4, now), 2u);
  EXPECT_EQ(t.peers_ahead(3, now), 4u);  // this peer (4) included
  EXPECT_EQ(t.peers_ahead(7, now), 0u);
  EXPECT_EQ(t.peers_ahead(4, now + 31s), 0u);  // their records went stale
}

// Rounds faster than the record refresh: after a round at epoch 5 the tracker still holds the
// members' records of epoch 4 or older. They are presumed at the new epoch with this peer's
// parameters, so reaching the next target means averaging with them, not stepping alone.
TEST(ProgressTracker, RoundMembersArePresumedAtTheNewEpoch) {
  auto now = t0();
  auto self = make_peer(), a = make_peer(), b = make_peer(), unknown = make_peer();
  ProgressTracker t(self, config(100));
  t.set_epoch(5);
  t.observe(a, rec(3, 11, 50, 8), 0s, now);  // two epochs behind: outdated
  t.observe(b, rec(4, 11, 50, 8), 0s, now);
  t.set_epoch(6);  // the round of epoch 5 with a, b and a peer not fetched yet succeeded
  t.set_digest(42);
  const std::vector<net::PeerId> members{self, a, b, unknown};
  t.round_succeeded(members, now);
  auto v = t.view(now);
  EXPECT_EQ(v.global_epoch, 6u);
  EXPECT_EQ(v.peers_at_global_epoch, 4u);
  EXPECT_EQ(v.samples_accumulated, 0u);  // they restart at 0 like this peer
  t.report_samples(100, 1s);
  auto d = t.decide(now + 10ms);
  EXPECT_EQ(d.action, Action::average_and_step);
  EXPECT_EQ(d.view.peers_at_global_epoch, 4u);
  // Same digest as ours: no fork.
  EXPECT_EQ(d.want_digest, 0u);
  // An outdated record fetched again (same seq, published before the round) changes nothing;
  // a newer one (higher seq) replaces the presumption.
  t.observe(a, rec(3, 11, 50, 8), 1s, now + 20ms);  // 1 s old: published before the round
  EXPECT_EQ(t.view(now + 20ms).peers_at_global_epoch, 4u);
  t.observe(a, rec(6, 42, 10, 9), 0s, now + 30ms);
  EXPECT_EQ(t.view(now + 30ms).peers_at_global_epoch, 4u);
}

// The peer published its progress at epoch 5 (a higher seq) just before the round all four
// stepped in, and the fetch brought it after the round: not news. Taken as the peer's state
// it would count 3 peers at epoch 6, a majority of 2, and two disjoint pairs could both step
// (seen: NetConvergence forked at one epoch). A record written after the round that still
// says epoch 5 is news: that peer really stayed behind.
TEST(ProgressTracker, RecordWrittenBeforeASharedRoundDoesNotPutThePeerBack) {
  auto now = t0();
  auto self = make_peer(), a = make_peer(), b = make_peer(), c = make_peer();
  ProgressTracker t(self, config(100));
  t.set_epoch(5);
  for (auto& p : {a, b, c}) t.observe(p, rec(5, 11, 50, 8), 0s, now);
  t.set_epoch(6);
  t.set_digest(42);
  const auto end = now + 500ms;
  t.round_succeeded({self, a, b, c}, end);
  ASSERT_EQ(t.view(end).peers_at_global_epoch, 4u);
  // seq 9, epoch 5, fetched 100 ms after the round, 300 ms old: written 200 ms before it.
  t.observe(a, rec(5, 11, 90, 9), 300ms, end + 100ms);
  EXPECT_EQ(t.view(end + 100ms).peers_at_global_epoch, 4u);
  // seq 10, epoch 5, written after the round: a stayed behind (its round failed).
  t.observe(a, rec(5, 11, 90, 10), 0s, end + 200ms);
  EXPECT_EQ(t.view(end + 200ms).peers_at_global_epoch, 3u);
}

// The view's all_at_epoch (the round's "begin once all of them joined" hint) counts every live
// peer, auxiliary ones included, and only while none is behind: a peer behind may still be
// finishing the previous round before it joins this one, and a leader that began without it
// would leave it out.
TEST(ProgressTracker, AllAtEpochOnlyWhenNoLivePeerIsBehind) {
  auto cfg = config(1000);
  ProgressTracker t(make_peer(), cfg);
  auto now = t0();
  t.set_epoch(5);
  EXPECT_EQ(t.view(now).all_at_epoch, 1u);  // alone
  t.observe(make_peer(), rec(5, 0, 10), 0s, now);
  auto aux = rec(5, 0, 0);
  aux.auxiliary = true;
  t.observe(make_peer(), aux, 0s, now);
  auto v = t.view(now);
  EXPECT_EQ(v.all_at_epoch, 3u);
  EXPECT_EQ(v.computing_at_global_epoch, 2u);
  const auto behind = make_peer();
  t.observe(behind, rec(4, 0, 10), 1s, now);
  EXPECT_EQ(t.view(now).all_at_epoch, 0u);
  // Once the peer behind publishes its new epoch, it counts.
  t.observe(behind, rec(5, 0, 10, 2), 0s, now + 1s);
  EXPECT_EQ(t.view(now + 1s).all_at_epoch, 4u);
  // A peer ahead: this one is behind, nobody is "all at the epoch".
  t.observe(make_peer(), rec(6, 0, 10), 0s, now + 1s);
  EXPECT_EQ(t.view(now + 1s).all_at_epoch, 0u);
  // Dead records do not count: after their lifetime this peer is alone again.
  EXPECT_EQ(t.view(now + cfg.stale_after + 2s).all_at_epoch, 1u);
}

// A peer two epochs behind must download the state before any round: the others' round does
// not wait for it (one behind still makes it wait, above).
TEST(ProgressTracker, AllAtEpochLeavesOutPeersTwoEpochsBehind) {
  ProgressTracker t(make_peer(), config(1000));
  const auto now = t0();
  t.set_epoch(7);
  t.observe(make_peer(), rec(7, 0, 10), 0s, now);
  t.observe(make_peer(), rec(7, 0, 10), 0s, now);
  const auto lagging = make_peer();
  t.observe(lagging, rec(5, 0, 10), 0s, now);
  auto v = t.view(now);
  EXPECT_EQ(v.num_peers, 4u);
  EXPECT_EQ(v.all_at_epoch, 3u);
  EXPECT_EQ(v.peers_at_global_epoch, 3u);
  // It downloaded and is one behind (its record lags): the round waits for it again.
  t.observe(lagging, rec(6, 0, 10, 2), 0s, now + 1s);
  EXPECT_EQ(t.view(now + 1s).all_at_epoch, 0u);
  t.observe(lagging, rec(7, 0, 10, 3), 0s, now + 2s);
  EXPECT_EQ(t.view(now + 2s).all_at_epoch, 4u);
}

// A round's majority counts the peers at the epoch and one behind (their record may lag a
// round they were in, or they download and join), not those two or more behind (they cannot
// join before a download). Counting only the peers at the epoch let two pairs of four step at
// one epoch, each seeing the other one behind.
TEST(ProgressTracker, MajorityBaseCountsPeersOneBehindNotFarBehind) {
  ProgressTracker t(make_peer(), config(1000));
  const auto now = t0();
  t.set_epoch(7);
  t.observe(make_peer(), rec(7, 0, 10), 0s, now);
  t.observe(make_peer(), rec(6, 0, 10), 0s, now);
  t.observe(make_peer(), rec(6, 0, 10), 0s, now);
  t.observe(make_peer(), rec(5, 0, 10), 0s, now);
  auto v = t.view(now);
  EXPECT_EQ(v.num_peers, 5u);
  EXPECT_EQ(v.peers_at_global_epoch, 2u);
  EXPECT_EQ(v.majority_base, 4u);  // a round needs 3: the two at 7 alone are no majority
  // This peer far behind counts itself out.
  ProgressTracker behind(make_peer(), config(1000));
  behind.set_epoch(4);
  behind.observe(make_peer(), rec(7, 0, 10), 0s, now);
  behind.observe(make_peer(), rec(7, 0, 10), 0s, now);
  EXPECT_EQ(behind.view(now).majority_base, 2u);
}
