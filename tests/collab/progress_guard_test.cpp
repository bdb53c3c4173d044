// ProgressGuard (src/collab/progress_guard.hpp): a flood of fake progress records under fresh
// identities, and inflated sample claims, reach the optimizer's tracker bounded. Fed through
// the real tracker: the view's peer count, samples and epoch stay those of the honest peers.
#include <gtest/gtest.h>

#include "collab/progress_guard.hpp"
#include "starling/crypto/keys.hpp"
#include "starling/training/progress.hpp"

using namespace starling;
using namespace starling::collab;
using namespace std::chrono_literals;

namespace {

net::PeerId fresh_peer() {
  return net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
}

training::ProgressEntry entry(const net::PeerId& p, std::uint64_t epoch, std::uint64_t samples,
                              double rate) {
  training::PeerProgress r;
  r.epoch = epoch;
  r.samples_accumulated = samples;
  r.samples_per_second = rate;
  r.seq = 1;
  r.ttl = 60s;
  r.publish_interval = 10s;
  return {p, training::encode_progress(r), 60s};
}

// The tracker's view of `entries` (as OptimizerIo::fetch_once feeds it).
training::CollaborationView view_of(const std::vector<training::ProgressEntry>& entries,
                                    std::uint64_t epoch, TimePoint now) {
  training::ProgressConfig cfg;
  cfg.target_batch_size = 1024;
  training::ProgressTracker t(fresh_peer(), cfg);
  t.set_epoch(epoch);
  for (const auto& e : entries) {
    auto r = training::decode_progress(e.value);
    EXPECT_TRUE(r);
    if (r) t.observe(e.peer, r.value(), 0s, now);
  }
  return t.view(now);
}

struct Honest {
  ProgressGuard guard;
  std::vector<net::PeerId> honest;
  std::vector<training::ProgressEntry> records;
  explicit Honest(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      honest.push_back(fresh_peer());
      records.push_back(entry(honest.back(), 5, 100 + 10 * i, 50 + i));
    }
  }
};

}  // namespace

// After a round with the honest peers, 24 fake identities claiming 1000x the samples and rate
// (and 12 more claiming an epoch far ahead) add at most kMaxUnproven peers to the view, and
// no claim beyond the median honest record.
TEST(ProgressGuard, FloodAfterTheRunFormedStaysBounded) {
  Honest run(4);
  const TimePoint t0 = Clock::now();
  (void)run.guard.filter(run.records, t0);
  for (const auto& p : run.honest) run.guard.vouch(p);
  const auto clean = view_of(run.guard.filter(run.records, t0), 5, t0);
  auto flooded = run.records;
  for (int i = 0; i < 24; ++i) flooded.push_back(entry(fresh_peer(), 5, 100000, 50000));
  for (int i = 0; i < 12; ++i) flooded.push_back(entry(fresh_peer(), 1005, 0, 50));
  ProgressGuard::Stats st;
  const auto out = run.guard.filter(flooded, t0 + 1s, &st);
  EXPECT_EQ(out.size(), run.records.size() + ProgressGuard::kMaxUnproven);
  EXPECT_EQ(st.epoch_dropped, 12u);
  EXPECT_EQ(st.unproven_dropped, 24 - ProgressGuard::kMaxUnproven);
  const auto v = view_of(out, 5, t0 + 1s);
  EXPECT_EQ(v.global_epoch, 5u) << "no download of a state nobody serves";
  EXPECT_EQ(v.num_peers, clean.num_peers + ProgressGuard::kMaxUnproven);
  // Each admitted fake counts at most as the median honest record.
  EXPECT_LE(v.samples_accumulated, clean.samples_accumulated + ProgressGuard::kMaxUnproven * 130);
  EXPECT_LE(v.samples_per_second, clean.samples_per_second + ProgressGuard::kMaxUnproven * 53);
  EXPECT_LT(v.samples_accumulated, 1024u) << "the fakes do not end the epoch";
}

// Without vouched peers (startup) unproven peers pass up to kMaxUnprovenStartup, the ones
// seen first first: honest peers published before the flood keep their place.
TEST(ProgressGuard, StartupKeepsTheEarliestSeen) {
  Honest run(6);
  const TimePoint t0 = Clock::now();
  (void)run.guard.filter(run.records, t0);
  auto flooded = run.records;
  for (int i = 0; i < 24; ++i) flooded.push_back(entry(fresh_peer(), 5, 100, 50));
  const auto out = run.guard.filter(flooded, t0 + 1s);
  ASSERT_EQ(out.size(), ProgressGuard::kMaxUnprovenStartup);
  for (const auto& p : run.honest)
    EXPECT_TRUE(std::any_of(out.begin(), out.end(), [&](const auto& e) { return e.peer == p; }));
}

// A minority of real (vouched) peers claiming 10x the samples and rate is capped at
// kClaimRatio x the median (at most the honest peers' largest x kClaimRatio); honest records
// pass unchanged.
TEST(ProgressGuard, InflatedClaimsAreCapped) {
  Honest run(5);
  for (const auto& p : run.honest) run.guard.vouch(p);
  for (int i = 0; i < 2; ++i) {
    const auto liar = fresh_peer();
    run.guard.vouch(liar);
    run.records.push_back(entry(liar, 5, 10 * 120, 10 * 52));
  }
  const auto out = run.guard.filter(run.records, Clock::now());
  ASSERT_EQ(out.size(), run.records.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    auto r = training::decode_progress(out[i].value);
    ASSERT_TRUE(r);
    if (i < 5) {
      EXPECT_EQ(out[i].value, run.records[i].value);
    } else {
      EXPECT_LE(r.value().samples_accumulated, ProgressGuard::kClaimRatio * 140);
      EXPECT_LE(r.value().samples_per_second, ProgressGuard::kClaimRatio * 54);
    }
  }
}

// With require_met() (as NetCollaboration sets it), unproven peers this host never connected
// to do not pass at all: a flood of fake identities at startup, before any round, leaves the
// view to the honest peers met.
TEST(ProgressGuard, UnmetIdentitiesDoNotPass) {
  Honest run(6);
  run.guard.require_met();
  for (const auto& p : run.honest) run.guard.met(p);
  auto flooded = run.records;
  for (int i = 0; i < 48; ++i) flooded.push_back(entry(fresh_peer(), 5, 100000, 50000));
  ProgressGuard::Stats st;
  const auto out = run.guard.filter(flooded, Clock::now(), &st);
  EXPECT_EQ(out.size(), run.records.size());
  EXPECT_EQ(st.unmet_dropped, 48u);
  const auto v = view_of(out, 5, Clock::now());
  EXPECT_EQ(v.num_peers, run.honest.size() + 1);
  EXPECT_LT(v.samples_accumulated, 1024u);
}
