// Progress estimation and step scheduling (the DeDLOC core), with simulated time.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "progress_support.hpp"

using namespace starling;
using namespace starling::training;

using namespace starling::training::progress_support;

TEST(ProgressRecord, RoundTrip) {
  PeerProgress p = rec(7, 1234, 56.5, 9);
  p.age_at_publish = 250ms;
  p.ttl = 60s;
  p.samples_total = 99999;
  p.client_mode = true;
  p.leaving = true;
  auto b = encode_progress(p);
  auto d = decode_progress(b);
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d.value(), p);
}

TEST(ProgressRecord, RejectsBadInput) {
  auto bad = [](PeerProgress p) { return decode_progress(encode_progress(p)); };
  auto p = rec(1, 10, std::nan(""));
  EXPECT_EQ(bad(p).error(), errc::invalid_argument);
  p = rec(1, 10, -1);
  EXPECT_EQ(bad(p).error(), errc::invalid_argument);
  p = rec(1, 10, std::numeric_limits<double>::infinity());
  EXPECT_EQ(bad(p).error(), errc::invalid_argument);
  p = rec(1, 10, 2e9);
  EXPECT_EQ(bad(p).error(), errc::invalid_argument);
  p = rec(1, std::uint64_t{1} << 60, 1);
  EXPECT_EQ(bad(p).error(), errc::invalid_argument);
  p = rec(1, 10, 1);
  p.age_at_publish = std::chrono::hours(100);
  EXPECT_EQ(bad(p).error(), errc::invalid_argument);
  p = rec(1, 0, 5);
  p.auxiliary = true;
  EXPECT_EQ(bad(p).error(), errc::invalid_argument);

  Bytes big(1000, 0x08);
  EXPECT_EQ(decode_progress(big).error(), errc::too_large);
  Bytes junk{0xff, 0xff, 0xff};
  EXPECT_EQ(decode_progress(junk).error(), errc::invalid_argument);
  // Random bytes never crash the decoder; whatever it accepts is within bounds.
  std::mt19937 rng(42);
  for (int i = 0; i < 20000; ++i) {
    Bytes b(rng() % 64);
    for (auto& x : b) x = static_cast<std::uint8_t>(rng());
    auto r = decode_progress(b);
    if (r) {
      EXPECT_TRUE(std::isfinite(r.value().samples_per_second));
      EXPECT_GE(r.value().samples_per_second, 0);
    }
  }
}

TEST(ProgressRecord, AgeFromTtl) {
  PeerProgress p = rec(0, 0, 0);
  p.age_at_publish = 1s;
  p.ttl = 60s;
  EXPECT_EQ(record_age(p, 45s), 16s);  // stored 15 s + 1 s old at publication
  EXPECT_EQ(record_age(p, 90s), 1s);   // a holder reporting more than the ttl: no storage age
}

TEST(ProgressTracker, ThroughputEstimate) {
  ProgressTracker t(make_peer(), config(1000));
  EXPECT_EQ(t.local_samples_per_second(), 0);
  for (int i = 0; i < 50; ++i) t.report_samples(64, 100ms);
  EXPECT_NEAR(t.local_samples_per_second(), 640, 1e-6);
  // A slowdown shows after a few half-lives of compute time.
  for (int i = 0; i < 600; ++i) t.report_samples(32, 100ms);
  EXPECT_NEAR(t.local_samples_per_second(), 320, 5);
  EXPECT_EQ(t.local_samples(), 50u * 64 + 600u * 32);
}

TEST(ProgressTracker, AlonePeerStepsOnItsOwnAtTheTarget) {
  ProgressTracker t(make_peer(), config(1000));
  auto now = t0();
  int steps = 0;
  for (int i = 0; i < 200; ++i) {
    t.report_samples(64, 100ms);
    now += 100ms;
    auto d = t.decide(now);
    EXPECT_NE(d.action, Action::begin_matchmaking);  // nobody to match with
    EXPECT_NE(d.action, Action::average_and_step);
    EXPECT_NE(d.action, Action::download_state);
    if (d.action == Action::step_alone) {
      EXPECT_GE(t.local_samples(), 1000u);
      EXPECT_LT(t.local_samples(), 1000u + 64);
      t.set_epoch(t.local_epoch() + 1);
      ++steps;
    }
  }
  EXPECT_EQ(steps, 200 * 64 / 1024);  // 1024 samples (16 batches) per step
  EXPECT_EQ(t.local_epoch(), static_cast<std::uint64_t>(steps));
}

TEST(ProgressTracker, EstimatesFromOthersRecords) {
  ProgressTracker t(make_peer(), config(1000));
  for (int i = 0; i < 10; ++i) t.report_samples(20, 100ms);  // 200 samples at 200/s
  auto now = t0();
  auto b = make_peer(), c = make_peer();
  t.observe(b, rec(0, 300, 100), 2s, now);  // ~ 300 + 2 * 100
  t.observe(c, rec(0, 50, 50), 0s, now);
  auto v = t.view(now);
  EXPECT_EQ(v.global_epoch, 0u);
  EXPECT_EQ(v.num_peers, 3u);
  EXPECT_EQ(v.peers_at_global_epoch, 3u);
  EXPECT_EQ(v.samples_accumulated, 200u + 500u + 50u);
  EXPECT_NEAR(v.samples_per_second, 350, 1e-9);
  ASSERT_TRUE(v.eta);
  EXPECT_NEAR(std::chrono::duration<double>(*v.eta).count(), 250.0 / 350.0, 1e-6);
  // One second later the records extrapolate (the local count does not: it is exact).
  v = t.view(now + 1s);
  EXPECT_EQ(v.samples_accumulated, 200u + 600u + 100u);
}

TEST(ProgressTracker, MatchmakingOnceThenAverageAndStep) {
  auto cfg = config(1000);
  cfg.matchmaking_time = 2s;
  ProgressTracker t(make_peer(), cfg);
  auto b = make_peer();
  auto now = t0();
  t.report_samples(100, 1s);  // 100/s
  t.observe(b, rec(0, 100, 100), 0s, now);
  // 200 of 1000 at 200/s: eta 4 s > 2 s.
  auto d = t.decide(now);
  EXPECT_EQ(d.action, Action::accumulate);
  // The next fetch comes no later than the moment matchmaking should begin.
  EXPECT_LE(d.next_fetch, 2s);
  EXPECT_GE(d.next_fetch, cfg.min_refresh);
  now += 2500ms;  // b extrapolates to 350; we report 250 more
  t.report_samples(250, 2500ms);
  d = t.decide(now);
  EXPECT_EQ(d.action, Action::begin_matchmaking);
  d = t.decide(now);
  EXPECT_EQ(d.action, Action::accumulate);  // only once per epoch
  now += 2s;
  t.report_samples(200, 2s);  // 550 + b's 550 >= 1000
  d = t.decide(now);
  EXPECT_EQ(d.action, Action::average_and_step);
  t.set_epoch(1);
  // b has not published epoch 1 yet: its old record is at epoch 0, so we are alone at 1.
  t.report_samples(10, 100ms);
  d = t.decide(now);
  EXPECT_EQ(d.view.global_epoch, 1u);
  EXPECT_EQ(d.view.peers_at_global_epoch, 1u);
  EXPECT_EQ(d.view.samples_accumulated, 10u);
}

// A peer that leaves says so in its last record: it stops counting at the next fetch (not
// after stale_after), records of it written before that (a slow replica) do not bring it
// back, and a record written after (it restarted with the same identity) does.
TEST(ProgressTracker, LeavingPeerStopsCountingAtOnce) {
  ProgressTracker t(make_peer(), config(1000));
  const auto b = make_peer(), c = make_peer();
  auto now = t0();
  t.set_epoch(3);
  t.observe(b, rec(3, 100, 50, 5), 0s, now);
  t.observe(c, rec(3, 100, 50, 5), 0s, now);
  EXPECT_EQ(t.peers_at(3, now), 3u);
  EXPECT_EQ(t.last_departure(), TimePoint{});
  auto bye = rec(3, 100, 50, 6);
  bye.leaving = true;
  t.observe(b, bye, 100ms, now + 1s);
  EXPECT_EQ(t.peers_at(3, now + 1s), 2u);
  EXPECT_EQ(t.view(now + 1s).num_peers, 2u);
  EXPECT_EQ(t.last_departure(), now + 1s);
  // Its record of before the goodbye, fetched later from another replica: ignored.
  t.observe(b, rec(3, 100, 50, 5), 1500ms, now + 2s);
  EXPECT_EQ(t.peers_at(3, now + 2s), 2u);
  // It came back (a new run: its seq starts over), written after the goodbye: it counts.
  t.observe(b, rec(3, 0, 50, 1), 0s, now + 3s);
  EXPECT_EQ(t.peers_at(3, now + 3s), 3u);
}

// With a per-peer share (DiLoCo), another peer's samples are extrapolated up to its share and
// no further: once there it waits for the outer round (overestimating it started rounds early,
// every peer then averaged fewer local steps); a record above the share still counts in full.
TEST(ProgressTracker, PerPeerShareCapsTheExtrapolation) {
  auto cfg = config(0);
  cfg.per_peer_target = 640;
  ProgressTracker t(make_peer(), cfg);
  const auto b = make_peer();
  const auto now = t0();
  t.observe(b, rec(0, 600, 1000), 0s, now);
  EXPECT_EQ(t.view(now).samples_accumulated, 600u);
  EXPECT_EQ(t.view(now + 10ms).samples_accumulated, 610u);
  EXPECT_EQ(t.view(now + 2s).samples_accumulated, 640u);  // not 2600
  t.observe(b, rec(0, 700, 1000, 2), 0s, now + 2s);
  EXPECT_EQ(t.view(now + 2s + 500ms).samples_accumulated, 700u);
}

TEST(ProgressTracker, DeadPeerNeverStallsTheOthers) {
  auto cfg = config(1000);
  ProgressTracker t(make_peer(), cfg);
  auto b = make_peer();
  auto now = t0();
  t.observe(b, rec(0, 900, 1000), 0s, now);  // b was fast and then died
  t.report_samples(50, 1s);
  auto d = t.decide(now);
  EXPECT_EQ(d.action, Action::begin_matchmaking);
  // Within stale_after its extrapolated samples make the target "reached": we try to average.
  d = t.decide(now + 1s);
  EXPECT_EQ(d.action, Action::average_and_step);
  // Once its record is stale it no longer counts, and we continue alone.
  now += cfg.stale_after + 1s;
  t.expire(now);
  EXPECT_EQ(t.known_peers(), 0u);
  d = t.decide(now);
  EXPECT_EQ(d.view.num_peers, 1u);
  EXPECT_EQ(d.action, Action::accumulate);
  t.report_samples(950, 19s);
  EXPECT_EQ(t.decide(now).action, Action::step_alone);
}

TEST(ProgressTracker, StaleAndOutdatedRecordsAreIgnored) {
  auto cfg = config(1000);
  ProgressTracker t(make_peer(), cfg);
  auto b = make_peer();
  auto now = t0();
  t.observe(b, rec(0, 500, 10), cfg.stale_after + 1s, now);  // too old on arrival
  EXPECT_EQ(t.known_peers(), 0u);
  t.observe(b, rec(0, 500, 10, /*seq=*/5), 1s, now);
  // An older copy (lower seq, written earlier) from a lagging replica is ignored.
  t.observe(b, rec(0, 100, 10, /*seq=*/4), 3s, now);
  EXPECT_EQ(t.view(now).samples_accumulated, 510u);
  // The same peer restarted: seq starts again, but the record is newer on our clock.
  t.observe(b, rec(0, 20, 10, /*seq=*/1), 0s, now + 5s);
  EXPECT_EQ(t.view(now + 5s).samples_accumulated, 20u);
  // Our own record, echoed by the DHT, is not counted twice.
  t.observe(t.self(), rec(0, 999, 10), 0s, now);
  EXPECT_EQ(t.known_peers(), 1u);
}

TEST(ProgressTracker, PeerBehindDownloadsState) {
  auto cfg = config(1000);
  ProgressTracker t(make_peer(), cfg);
  auto now = t0();
  t.observe(make_peer(), rec(5, 100, 10), 0s, now);
  t.observe(make_peer(), rec(4, 100, 10), 0s, now);  // itself behind: its samples don't count
  t.report_samples(5000, 1s);
  auto d = t.decide(now);
  EXPECT_EQ(d.action, Action::download_state);
  EXPECT_EQ(d.view.global_epoch, 5u);
  EXPECT_EQ(d.view.samples_accumulated, 100u);
  EXPECT_EQ(d.view.peers_at_global_epoch, 1u);
  t.set_epoch(5);  // state downloaded
  EXPECT_NE(t.decide(now).action, Action::download_state);

  // With delayed parameter updates one epoch of lag is tolerated.
  cfg.epoch_tolerance = 1;
  ProgressTracker u(make_peer(), cfg);
  u.set_epoch(4);
  u.observe(make_peer(), rec(5, 100, 10), 0s, now);
  EXPECT_EQ(u.decide(now).action, Action::accumulate);
  u.set_epoch(3);
  EXPECT_EQ(u.decide(now).action, Action::download_state);
}

TEST(ProgressTracker, PeerAheadOfEveryoneStepsAlone) {
  ProgressTracker t(make_peer(), config(100));
  auto now = t0();
  t.set_epoch(3);
  t.observe(make_peer(), rec(1, 90, 10), 0s, now);  // two behind: will download from us
  t.report_samples(100, 1s);
  auto d = t.decide(now);
  EXPECT_EQ(d.action, Action::step_alone);
  EXPECT_EQ(d.view.num_peers, 2u);
  // One epoch behind is most likely a peer that has just stepped with us and not published
  // yet: stepping alone could fork the parameters, so try a round (it fails if they are
  // really behind).
  auto b = make_peer();
  t.observe(b, rec(2, 90, 10), 0s, now);
  EXPECT_EQ(t.decide(now).action, Action::average_and_step);
}

TEST(ProgressTracker, DecisionsDoNotDependOnTheClockOrigin) {
  // Clock skew: two peers' clocks differ arbitrarily; only durations travel. The same
  // scenario replayed from two different origins gives the same decisions.
  auto a = make_peer(), b = make_peer(), self = make_peer();
  auto run = [&](TimePoint origin) {
    ProgressTracker t(self, config(2000));
    std::vector<std::pair<Action, std::uint64_t>> out;
    auto now = origin;
    for (int i = 0; i < 100; ++i) {
      now += 250ms;
      t.report_samples(30, 250ms);
      t.observe(a, rec(t.local_epoch(), 40u * (i % 20), 160, i + 1), 300ms, now);
      t.observe(b, rec(t.local_epoch(), 10u * (i % 20), 40, i + 1), 1200ms, now);
      auto d = t.decide(now);
      out.emplace_back(d.action, d.view.samples_accumulated);
      if (d.action == Action::average_and_step) t.set_epoch(t.local_epoch() + 1);
    }
    return out;
  };
  auto x = run(t0());
  auto y = run(TimePoint{} + std::chrono::hours(24 * 365 * 30) + 123456789ns);
  EXPECT_EQ(x, y);
}

TEST(ProgressTracker, PerPeerTargetScalesWithComputingPeers) {
  auto cfg = config(1);
  cfg.per_peer_target = 100;  // DiLoCo: H x batch size
  ProgressTracker t(make_peer(), cfg);
  auto now = t0();
  t.report_samples(90, 1s);
  EXPECT_EQ(t.view(now).target, 100u);
  t.observe(make_peer(), rec(0, 90, 90), 0s, now);
  t.observe(make_peer(), rec(0, 90, 90), 0s, now);
  auto aux = rec(0, 0, 0);
  aux.auxiliary = true;
  t.observe(make_peer(), aux, 0s, now);
  auto v = t.view(now);
  EXPECT_EQ(v.computing_at_global_epoch, 3u);
  EXPECT_EQ(v.peers_at_global_epoch, 4u);
  EXPECT_EQ(v.target, 300u);
  EXPECT_EQ(t.decide(now).action, Action::begin_matchmaking);
  // The others are extrapolated up to their share (100 each), not beyond: 90 + 2 x 100 < 300.
  EXPECT_EQ(t.decide(now + 1s).action, Action::accumulate);
  t.report_samples(10, 100ms);  // this peer reaches its share too
  EXPECT_EQ(t.decide(now + 1s).action, Action::average_and_step);
}

TEST(ProgressTracker, NextFetchIsClamped) {
  auto cfg = config(1000000);
  ProgressTracker t(make_peer(), cfg);
  auto now = t0();
  EXPECT_EQ(t.decide(now).next_fetch, 4 * cfg.min_refresh);  // nobody computes: no eta
  t.report_samples(1, 1s);
  EXPECT_EQ(t.decide(now).next_fetch, 4 * cfg.min_refresh);  // alone: look for joiners
  t.observe(make_peer(), rec(0, 0, 0), 0s, now);
  EXPECT_EQ(t.decide(now).next_fetch, cfg.max_refresh);  // eta is days
  t.report_samples(999990, 1s);
  EXPECT_EQ(t.decide(now).next_fetch, cfg.min_refresh);  // eta is microseconds
}

TEST(ProgressTracker, Publishing) {
  auto cfg = config(1000);
  cfg.max_publish_interval = 5s;
  ProgressTracker t(make_peer(), cfg);
  auto now = t0();
  EXPECT_TRUE(t.should_publish(now));
  t.report_samples(10, 1s);
  auto r1 = t.make_record(now, 60s);
  EXPECT_EQ(r1.seq, 1u);
  EXPECT_EQ(r1.samples_accumulated, 10u);
  EXPECT_EQ(r1.ttl, 60s);
  EXPECT_FALSE(t.should_publish(now + 1s));
  EXPECT_TRUE(t.should_publish(now + 5s));
  t.set_epoch(1);
  EXPECT_TRUE(t.should_publish(now + 1s));  // epoch changed: at once
  auto r2 = t.make_record(now + 1s, 60s);
  EXPECT_EQ(r2.seq, 2u);
  EXPECT_EQ(r2.epoch, 1u);
  EXPECT_EQ(r2.samples_accumulated, 0u);
  EXPECT_EQ(r2.samples_total, 10u);
}

TEST(ProgressTracker, AuxiliaryPeerJoinsRoundsWithoutComputing) {
  auto cfg = config(1000);
  cfg.auxiliary = true;
  ProgressTracker t(make_peer(), cfg);
  auto now = t0();
  auto a = make_peer(), b = make_peer();
  t.observe(a, rec(3, 400, 100), 0s, now);
  EXPECT_EQ(t.decide(now).action, Action::accumulate);  // one computing peer: nothing to help
  EXPECT_EQ(t.local_epoch(), 3u);  // follows the collaboration, never downloads
  t.observe(b, rec(3, 400, 100), 0s, now);
  // 800 of 1000 at 200/s: 1 s to go, inside the matchmaking time.
  EXPECT_EQ(t.decide(now).action, Action::begin_matchmaking);
  auto r = t.make_record(now, 60s);
  EXPECT_TRUE(r.auxiliary);
  EXPECT_EQ(r.samples_per_second, 0);
  EXPECT_EQ(t.decide(now + 1s).action, Action::average_and_step);
}

// A deterministic simulation: peers of different speeds, each with its own tracker, share
// records through a "DHT" that delays them. Every collaborative step must be taken by all
// live peers at the same epoch, and each epoch must contain about target samples.
TEST(ProgressTracker, SimulatedCollaborationStepsTogether) {
  constexpr std::uint64_t kTarget = 4096;
  struct Sim {
    net::PeerId id;
    std::unique_ptr<ProgressTracker> tracker;
    double sps;
    Duration batch_time;
    std::uint64_t batch;
    TimePoint next_batch;
    TimePoint next_fetch;
  };
  std::vector<Sim> peers;
  const double speeds[] = {300, 500, 800, 1200};
  auto now = t0();
  for (double s : speeds) {
    auto cfg = config(kTarget);
    cfg.matchmaking_time = 1s;
    Sim p{make_peer(), nullptr, s, {}, 32, now, now};
    p.tracker = std::make_unique<ProgressTracker>(p.id, cfg);
    p.batch_time = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(32.0 / s));
    peers.push_back(std::move(p));
  }
  // DHT contents: last published record and when it was published.
  std::map<net::PeerId, std::pair<PeerProgress, TimePoint>> dht;
  std::uint64_t epoch_samples = 0;
  std::vector<std::uint64_t> samples_per_epoch;
  const auto end = now + 60s;
  while (now < end) {
    now += 10ms;
    for (auto& p : peers) {
      auto& t = *p.tracker;
      while (p.next_batch <= now) {
        t.report_samples(p.batch, p.batch_time);
        epoch_samples += p.batch;
        p.next_batch += p.batch_time;
      }
      if (t.should_publish(now)) dht[p.id] = {t.make_record(now, 60s), now};
      if (p.next_fetch <= now) {
        for (auto& [id, r] : dht) t.observe(id, r.first, now - r.second, now);
        auto d = t.decide(now);
        p.next_fetch = now + d.next_fetch;
      }
    }
    // A round happens when every peer has decided to average (what the averager's group
    // formation would enforce); then all step together.
    bool all_ready = true;
    for (auto& p : peers) {
      auto d = p.tracker->decide(now);
      if (d.action != Action::average_and_step) all_ready = false;
      EXPECT_NE(d.action, Action::download_state);
      EXPECT_NE(d.action, Action::step_alone);
    }
    if (all_ready) {
      std::uint64_t e = peers[0].tracker->local_epoch();
      for (auto& p : peers) {
        EXPECT_EQ(p.tracker->local_epoch(), e);
        p.tracker->set_epoch(e + 1);
        dht[p.id] = {p.tracker->make_record(now, 60s), now};
      }
      samples_per_epoch.push_back(epoch_samples);
      epoch_samples = 0;
    }
  }
  // 2800 samples/s for 60 s is ~41 epochs of 4096.
  ASSERT_GE(samples_per_epoch.size(), 30u);
  // The first epoch includes discovery (peers start knowing nobody and find each other on
  // their next fetch, 2 s later); after that each step happens within 10% of the target.
  EXPECT_GE(samples_per_epoch[0], kTarget);
  EXPECT_LE(samples_per_epoch[0], kTarget * 3 / 2);
  for (std::size_t i = 1; i < samples_per_epoch.size(); ++i) {
    EXPECT_GE(samples_per_epoch[i], kTarget);
    EXPECT_LE(samples_per_epoch[i], kTarget * 11 / 10) << "epoch " << i << " overshoots";
  }
}

// A dead peer stops counting once its record is older than twice its publish interval plus
// the grace (or its ttl), long before stale_after.
TEST(ProgressTracker, DeadPeerExpiresByItsPublishIntervalAndTtl) {
  auto cfg = config(1000);
  cfg.publish_grace = 1s;
  ProgressTracker t(make_peer(), cfg);
  auto b = make_peer(), c = make_peer();
  auto now = t0();
  auto rb = rec(0, 100, 10);
  rb.publish_interval = 2s;  // dead after 2 x 2 s + 1 s = 5 s
  t.observe(b, rb, 0s, now);
  auto rc = rec(0, 100, 10);
  rc.ttl = 3s;  // dead after 3 s
  t.observe(c, rc, 0s, now);
  EXPECT_EQ(t.view(now + 2900ms).num_peers, 3u);
  EXPECT_EQ(t.view(now + 3100ms).num_peers, 2u);
  EXPECT_EQ(t.view(now + 4900ms).num_peers, 2u);
  EXPECT_EQ(t.view(now + 5100ms).num_peers, 1u);
  t.expire(now + 5100ms);
  EXPECT_EQ(t.known_peers(), 0u);
  EXPECT_LT(now + 5100ms, now + cfg.stale_after);
  // A record already too old on arrival is not taken.
  t.observe(b, rb, 6s, now);
  EXPECT_EQ(t.known_peers(), 0u);
  // The interval travels in the record.
  auto d = decode_progress(encode_progress(rb));
  ASSERT_TRUE(d);
  EXPECT_EQ(d.value().publish_interval, 2s);
  ProgressTracker u(make_peer(), cfg);
  EXPECT_EQ(u.make_record(now, 60s).publish_interval, cfg.max_publish_interval);
}

// A peer is "alone at its epoch" only if no live computing peer is at its epoch or ahead.
TEST(ProgressTracker, OthersAtEpoch) {
  auto cfg = config(1000);
  ProgressTracker t(make_peer(), cfg);
  auto now = t0();
  t.set_epoch(5);
  EXPECT_FALSE(t.others_at_epoch(now));
  t.observe(make_peer(), rec(4, 0, 10), 0s, now);  // behind
  auto aux = rec(5, 0, 0);
  aux.auxiliary = true;
  t.observe(make_peer(), aux, 0s, now);
  EXPECT_FALSE(t.others_at_epoch(now));
  t.observe(make_peer(), rec(5, 0, 10), 0s, now);
  EXPECT_TRUE(t.others_at_epoch(now));
  EXPECT_FALSE(t.others_at_epoch(now + cfg.stale_after + 1s));
}
