// RunAggregator: contributors, totals, expiry, bad records and bounded history.
#include <gtest/gtest.h>

#include "starling/monitor/aggregator.hpp"
#include "starling/monitor/dashboard.hpp"

using namespace starling;
using namespace starling::monitor;

namespace {

net::PeerId peer() {
  return net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
}

MetricsEntry entry(const net::PeerId& p, std::uint64_t epoch, double sps, double loss,
                   std::uint64_t seq, Duration remaining = 50s) {
  MetricsRecord r;
  r.name = "peer";
  r.epoch = epoch;
  r.samples_per_second = sps;
  r.loss = loss;
  r.samples_total = 1000 * (seq + 1);
  r.bytes_sent = 100;
  r.bytes_received = 50;
  r.target_batch_size = 1000;
  r.samples_accumulated = 400;
  r.seq = seq;
  r.ttl_ms = 60'000;
  MetricsEntry e;
  e.peer = p;
  e.value = encode_metrics(r).value();
  e.remaining_ttl = remaining;
  return e;
}

}  // namespace

TEST(MonitorAggregator, TotalsContributorsAndExpiry) {
  const auto t0 = Clock::now();
  RunAggregator a(t0);
  const auto p1 = peer(), p2 = peer();
  a.update(t0 + 1s, {entry(p1, 3, 100, 2.0, 0), entry(p2, 4, 300, 1.0, 0, 40s)});
  ASSERT_EQ(a.contributors().size(), 2u);
  const auto& t = a.totals();
  EXPECT_EQ(t.epoch, 4u);
  EXPECT_EQ(t.peers, 2u);
  EXPECT_DOUBLE_EQ(t.samples_per_second, 400);
  EXPECT_EQ(t.samples_total, 2000u);
  EXPECT_EQ(t.bytes_sent, 200u);
  EXPECT_DOUBLE_EQ(*t.loss, (2.0 * 100 + 1.0 * 300) / 400);  // throughput-weighted
  ASSERT_TRUE(t.eta_s);
  EXPECT_DOUBLE_EQ(*t.eta_s, 600.0 / 400);
  EXPECT_DOUBLE_EQ(a.contributors().at(p2.to_string()).age_s, 20);
  EXPECT_FALSE(t.eval);
  // The newest evaluation (highest eval epoch) is the run's.
  auto with_eval = [](MetricsEntry e, double acc, std::uint64_t epoch) {
    auto r = decode_metrics(e.value).value();
    r.eval = MetricsRecord::Eval{acc, 0.4, epoch};
    r.eval->perplexity = 100.0 + static_cast<double>(epoch);  // as the language-model task does
    e.value = encode_metrics(r).value();
    return e;
  };
  a.update(t0 + 2s, {with_eval(entry(p1, 3, 100, 2.0, 0), 0.7, 2),
                     with_eval(entry(p2, 4, 300, 1.0, 0, 40s), 0.8, 4)});
  ASSERT_TRUE(a.totals().eval);
  EXPECT_DOUBLE_EQ(a.totals().eval->accuracy, 0.8);
  EXPECT_EQ(a.history().back().eval_accuracy, 0.8);
  EXPECT_EQ(a.history().back().eval_perplexity, 104.0);
  // p1 is gone (its record expired): it leaves the table; p2 advanced.
  a.update(t0 + 3s, {entry(p2, 5, 300, 0.9, 1)});
  EXPECT_EQ(a.contributors().size(), 1u);
  EXPECT_EQ(a.totals().epoch, 5u);
  EXPECT_DOUBLE_EQ(a.contributors().at(p2.to_string()).first_seen_s, 1);
  EXPECT_DOUBLE_EQ(a.contributors().at(p2.to_string()).last_seen_s, 3);
  ASSERT_EQ(a.history().size(), 3u);
  EXPECT_EQ(a.history()[0].epoch, 4u);
  EXPECT_EQ(a.history()[2].epoch, 5u);
}

TEST(MonitorAggregator, SkipsBadRecordsAndBoundsHistory) {
  const auto t0 = Clock::now();
  AggregatorConfig cfg;
  cfg.max_points = 5;
  RunAggregator a(t0, cfg);
  MetricsEntry junk;
  junk.peer = peer();
  junk.value = to_bytes("not a record");
  for (int i = 0; i < 20; ++i)
    a.update(t0 + std::chrono::seconds(i), {junk, entry(peer(), 1, 1, 1, 0)});
  EXPECT_EQ(a.rejected(), 20u);
  EXPECT_EQ(a.contributors().size(), 1u);
  EXPECT_EQ(a.history().size(), 5u);
  EXPECT_EQ(a.updates(), 20u);
}

TEST(MonitorAggregator, JsonAndPrometheus) {
  const auto t0 = Clock::now();
  RunAggregator a(t0);
  const auto p = peer();
  auto e = entry(p, 2, 10, 0.5, 0);
  auto rec = decode_metrics(e.value).value();
  rec.name = "<b>\"quoted\"</b>";
  e.value = encode_metrics(rec).value();
  a.update(t0 + 1s, {e});
  const auto json = to_json(a, "run-1", 1234);
  EXPECT_NE(json.find("\"run_id\":\"run-1\""), std::string::npos);
  EXPECT_NE(json.find("\"generated_unix_ms\":1234"), std::string::npos);
  EXPECT_NE(json.find(R"(<b>\"quoted\"</b>)"), std::string::npos);
  EXPECT_NE(json.find(p.to_string()), std::string::npos);
  const auto prom = to_prometheus(a, "run-\"1\"");
  EXPECT_NE(prom.find("starling_run_epoch{run=\"run-\\\"1\\\"\"} 2"), std::string::npos);
  EXPECT_NE(prom.find("# TYPE starling_run_peers gauge"), std::string::npos);
}

// Task identities: at start every mismatch refuses; later only a peer that has run longer
// (uptime at publication + the record's age) makes this one leave, so of two mismatched
// trainers started together exactly one leaves.
TEST(MonitorIdentity, TheYoungerOfTwoMismatchedPeersLeaves) {
  const auto self = peer(), other = peer(), same = peer(), silent = peer();
  auto with = [](MetricsEntry e, const std::string& task, double uptime_s) {
    auto r = decode_metrics(e.value).value();
    r.task = task;
    r.uptime_s = uptime_s;
    e.value = encode_metrics(r).value();
    return e;
  };
  // other: uptime 30 s when published, 10 s ago (ttl 60 s, 50 s left) -> started 40 s ago.
  const std::vector<MetricsEntry> entries = {
      with(entry(same, 1, 10, 1.0, 0), "lm tiny bpe:aaaa", 100),
      with(entry(silent, 1, 10, 1.0, 0), "", 500),  // no identity published: not checked
      with(entry(other, 1, 10, 1.0, 0, 50s), "lm tiny bpe:bbbb", 30),
      with(entry(self, 1, 10, 1.0, 0), "lm tiny bpe:cccc", 999),  // its own: skipped
  };
  // At start: refused.
  auto at_start = older_identity_conflict(entries, self, "lm tiny bpe:aaaa", 0);
  ASSERT_TRUE(at_start);
  EXPECT_EQ(at_start->peer, other);
  EXPECT_EQ(at_start->task, "lm tiny bpe:bbbb");
  // Running for 20 s: the other started 40 s ago, so this peer is the younger and leaves.
  EXPECT_TRUE(older_identity_conflict(entries, self, "lm tiny bpe:aaaa", 20));
  // Running for 60 s: this peer is the older; the other one leaves instead.
  EXPECT_FALSE(older_identity_conflict(entries, self, "lm tiny bpe:aaaa", 60));
  // Started about together (within the 5 s margin): the peer ids decide, alike on both sides,
  // so exactly one of the two leaves.
  const bool self_leaves =
      older_identity_conflict(entries, self, "lm tiny bpe:aaaa", 38).has_value();
  EXPECT_EQ(self_leaves, other.to_string() < self.to_string());
  const std::vector<MetricsEntry> self_seen = {
      with(entry(self, 1, 10, 1.0, 0, 60s), "lm tiny bpe:aaaa", 38)};
  const bool other_leaves =
      older_identity_conflict(self_seen, other, "lm tiny bpe:bbbb", 40).has_value();
  EXPECT_NE(self_leaves, other_leaves);
  // With the other's identity, the conflict is with the first peer instead.
  auto as_other = older_identity_conflict(entries, self, "lm tiny bpe:bbbb", 0);
  ASSERT_TRUE(as_other);
  EXPECT_EQ(as_other->peer, same);
  // Every peer agreeing (or publishing no identity) is no conflict.
  EXPECT_FALSE(older_identity_conflict({entries[0], entries[1]}, self, "lm tiny bpe:aaaa", 0));
  // Seen from the other side with the same records (this peer 60 s old, published now):
  // the other, 40 s old, is the younger and must leave.
  const std::vector<MetricsEntry> seen_by_other = {
      with(entry(self, 1, 10, 1.0, 0, 60s), "lm tiny bpe:aaaa", 60)};
  EXPECT_TRUE(older_identity_conflict(seen_by_other, other, "lm tiny bpe:bbbb", 40));
  // A damaged record is skipped, not a conflict.
  MetricsEntry junk;
  junk.peer = other;
  junk.value = to_bytes("not a record");
  EXPECT_FALSE(older_identity_conflict({junk}, self, "lm tiny bpe:aaaa", 0));
}
