// Compressed all-reduce over the network, checked against an independent replay of the
// protocol: the same plan, the same per-tensor encodings by every sender, the same reduction
// order and the owner's encoded result. Every member must hold exactly the replayed bytes, and
// the replay's error against the exact weighted mean must stay within the codecs' stated
// bounds, compounded over the two encodings (sender -> owner, owner -> everyone).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "averaging/compression_test_support.hpp"
#include "net_harness.hpp"
#include "starling/averaging/compression.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace std::chrono_literals;
namespace ts = starling::averaging::test_support;

namespace {

AveragerConfig cfg_for_codecs() {
  auto c = test::base_config();
  c.round.stall_timeout = 15s;  // no faults here
  return c;
}

// The codec the averager uses for tensor t of the schema (part_codec.hpp's rule).
CodecSpec codec_of(const Schema& s, std::size_t t) {
  if (s.codec != "auto") return CodecSpec{*codec_from_string(s.codec)};
  return CompressionPolicy{}.choose(t, s.tensors[t].numel());
}

struct Replay {
  std::vector<float> out;     // what every member must hold
  std::vector<double> bound;  // stated error bound per element
  std::vector<double> exact;  // the exact weighted mean
};

Replay replay(test::Cluster& c, const GroupInfo& g, const Schema& schema) {
  const std::size_t n = g.members.size();
  const std::uint64_t N = schema.numel();
  std::vector<Capacity> caps;
  double wsum = 0;
  for (const auto& m : g.members) {
    caps.push_back({m.bandwidth, m.client});
    wsum += m.weight;
  }
  std::vector<Segment> segs{{0, N}};
  auto plan = make_plan(segs, caps, Bitset(n, true), 4096).value();
  std::vector<std::uint64_t> ends;
  std::uint64_t e = 0;
  for (const auto& t : schema.tensors) ends.push_back(e += t.numel());
  std::vector<float> coeffs;
  for (const auto& m : g.members) coeffs.push_back(static_cast<float>(m.weight / wsum));

  Replay r;
  r.out.assign(N, 0);
  r.bound.assign(N, 0);
  r.exact.assign(N, 0);
  for (std::uint64_t i = 0; i < N; ++i)
    for (std::size_t j = 0; j < n; ++j)
      r.exact[i] += g.members[j].weight / wsum * c.node(j).initial_flat[i];
  for (const auto& part : plan.parts) {
    std::uint64_t a = part.begin;
    for (std::size_t t = 0; t < ends.size() && a < part.end; ++t) {
      if (ends[t] <= a) continue;
      const std::uint64_t b = std::min(part.end, ends[t]);
      const std::size_t len = b - a;
      const CodecSpec spec = codec_of(schema, t);
      std::vector<float> mean(len, 0.0f);
      std::vector<double> pbound(len, 0.0);
      for (std::size_t j = 0; j < n; ++j) {
        std::vector<float> x(c.node(j).initial_flat.begin() + a,
                             c.node(j).initial_flat.begin() + b);
        std::vector<float> y = x;
        if (j != part.owner) {
          auto enc = encode(spec, x).value();
          EXPECT_TRUE(decode(enc, y));
          auto bj = ts::element_bounds(spec, x, enc);
          for (std::size_t i = 0; i < len; ++i) pbound[i] += coeffs[j] * bj[i];
        }
        for (std::size_t i = 0; i < len; ++i)
          mean[i] = j == 0 ? coeffs[j] * y[i] : mean[i] + coeffs[j] * y[i];
      }
      auto enc = encode(spec, mean).value();
      std::vector<float> fin(len);
      EXPECT_TRUE(decode(enc, fin));
      auto rb = ts::element_bounds(spec, mean, enc);
      for (std::size_t i = 0; i < len; ++i) {
        r.out[a + i] = fin[i];
        // Float rounding of the reduction itself: a few ulps of the largest input (|x| <= 2).
        r.bound[a + i] = pbound[i] + rb[i] + 1e-6;
      }
      a = b;
    }
  }
  return r;
}

}  // namespace

TEST(AveragerCompression, EveryCodecMatchesTheReplayWithinItsBound) {
  ts::QuietLog quiet;
  const std::vector<std::string> codecs{"none",      "float16",    "bfloat16",   "uniform8",
                                        "quantile8", "blockwise8", "blockwise4", "auto"};
  const std::vector<double> w{1, 2, 3, 4};
  for (const auto& name : codecs) {
    SCOPED_TRACE(name);
    // 25000 x 3 values puts the big tensor above the "auto" float16 limit (blockwise8 there).
    auto schema = test::test_schema(25000);
    schema.codec = name;
    std::vector<test::NodeOptions> opts(4);
    opts[1].bandwidth = 3 * opts[0].bandwidth;  // mixed bandwidths: unequal shares
    opts[3].client = true;                      // a client-mode peer: sends, owns nothing
    test::Cluster c(4, schema, cfg_for_codecs(), opts, 71);
    auto g = c.group(w);
    std::vector<StepOptions> so(4);
    for (std::size_t i = 0; i < 4; ++i) {
      so[i].weight = w[i];
      so[i].group = g;
    }
    auto res = c.step_all(so);
    std::uint64_t sent = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(res[i]) << "node " << i << ": " << res[i].error().message();
      sent += res[i].value().bytes_sent;
    }
    auto want = replay(c, g, schema);
    double worst = 0, worst_ratio = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      auto f = c.flat(i);
      ASSERT_EQ(std::memcmp(f.data(), want.out.data(), f.size() * sizeof(float)), 0)
          << "node " << i << " differs from the replay";
    }
    for (std::size_t e = 0; e < want.out.size(); ++e) {
      const double err = std::abs(want.out[e] - want.exact[e]);
      ASSERT_LE(err, want.bound[e]) << "element " << e;
      worst = std::max(worst, err);
      worst_ratio = std::max(worst_ratio, err / want.bound[e]);
    }
    std::printf("%-10s max error %.3g (%.0f%% of its bound), %llu bytes sent, codec time %.1f ms\n",
                name.c_str(), worst, 100 * worst_ratio, static_cast<unsigned long long>(sent),
                std::chrono::duration<double, std::milli>(res[0].value().codec_time).count());
  }
}

TEST(AveragerCompression, ErrorFeedbackKeepsTheRunningMeanExact) {
  // The same inputs averaged over many steps: with error feedback the running mean of the
  // results converges to the exact mean (the error of one step is sent in the next); without
  // it the blockwise4 error repeats every step.
  ts::QuietLog quiet;
  auto schema = test::test_schema(3000);
  schema.codec = "blockwise4";
  auto run = [&](bool feedback) {
    auto cfg = cfg_for_codecs();
    cfg.error_feedback = feedback;
    test::Cluster c(3, schema, cfg, {}, 81);
    const std::vector<std::vector<float>> init{c.node(0).initial_flat, c.node(1).initial_flat,
                                               c.node(2).initial_flat};
    auto g = c.group({1, 1, 1});
    std::vector<StepOptions> so(3);
    for (auto& o : so) o.group = g;
    const std::size_t N = init[0].size();
    std::vector<double> sum(N, 0), exact(N, 0);
    for (std::size_t e = 0; e < N; ++e) exact[e] = (init[0][e] + init[1][e] + init[2][e]) / 3.0;
    const int steps = 8;
    for (int s = 0; s < steps; ++s) {
      for (std::size_t i = 0; i < 3; ++i) c.set_flat(i, init[i]);  // same inputs every step
      auto res = c.step_all(so);
      for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(res[i]);
      auto f = c.flat(0);
      for (std::size_t e = 0; e < N; ++e) sum[e] += f[e];
    }
    double err = 0;
    for (std::size_t e = 0; e < N; ++e) err += std::abs(sum[e] / steps - exact[e]);
    return err / static_cast<double>(N);
  };
  const double with = run(true), without = run(false);
  std::printf("mean |running mean - exact| after 8 steps: %.3g with error feedback, %.3g without\n",
              with, without);
  EXPECT_LT(with, without / 3);
}
