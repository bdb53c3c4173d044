// Averager features for collaborative training: a per-step round key (peers at different
// epochs never average together), several averagers on one host (per-averager protocol ids),
// and state transfer of byte blobs (several donors, per-part hashes, resume after a donor dies,
// lazy donors, a size limit).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "net_harness.hpp"
#include "starling/averaging/wire.hpp"

using namespace starling;
using namespace starling::averaging;
using starling::averaging::test::base_config;
using starling::averaging::test::Cluster;

namespace {

std::vector<float> mean_of(Cluster& c, const std::vector<std::size_t>& who) {
  std::vector<float> m(c.node(who[0]).initial_flat.size(), 0.0f);
  for (std::size_t e = 0; e < m.size(); ++e) {
    double s = 0;
    for (auto j : who) s += c.node(j).initial_flat[e];
    m[e] = static_cast<float>(s / static_cast<double>(who.size()));
  }
  return m;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t e = 0; e < got.size(); ++e)
    if (std::abs(got[e] - want[e]) > 2e-5 * (1 + std::abs(want[e]))) {
      ADD_FAILURE() << "element " << e << " = " << got[e] << ", want " << want[e];
      return;
    }
}

Bytes random_blob(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  return b;
}

}  // namespace

TEST(AveragerKeys, RoundKeySeparatesEpochs) {
  // Four peers step at once under one averager key, two in round "grads/1" and two in
  // "grads/2": each pair averages only with itself.
  const std::size_t n = 4;
  Cluster c(n, test::test_schema(3000), base_config(), {}, 61);
  std::vector<StepOptions> so(n);
  for (std::size_t i = 0; i < n; ++i) {
    so[i].timeout = 40s;
    so[i].matchmaking_timeout = 15s;
    so[i].round = i < 2 ? "grads/1" : "grads/2";
  }
  auto res = c.step_all(so);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(res[i]) << "node " << i << ": " << res[i].error().message();
    EXPECT_EQ(res[i].value().group.members.size(), 2u) << "node " << i;
  }
  expect_near(c.flat(0), mean_of(c, {0, 1}));
  expect_near(c.flat(2), mean_of(c, {2, 3}));
  EXPECT_EQ(c.flat(0), c.flat(1));
  EXPECT_EQ(c.flat(2), c.flat(3));
  EXPECT_NE(c.flat(0), c.flat(2));
}

TEST(AveragerKeys, BadRoundIsRejected) {
  Cluster c(1, test::test_schema(10), base_config(), {}, 62);
  StepOptions o;
  o.round = "a]b";
  auto r = c.node(0).run([a = c.node(0).avg, o]() { return a->step(o); });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::invalid_argument);
  EXPECT_FALSE(GroupKey::initial({"a/b", 16, 0}, 1));
  EXPECT_FALSE(GroupKey::initial({"a b", 16, 0}, 1));
  EXPECT_EQ(averaging_protocol(kJoinProtocol, "run.grads"),
            "/starling/averaging/join/1.0.0/run.grads");
}

TEST(AveragerKeys, TwoAveragersOnOneHost) {
  // Every host runs the cluster's averager (prefix "test") and a second one (prefix "other")
  // over other tensors; both step at the same time and each averages its own tensors.
  const std::size_t n = 3;
  Cluster c(n, test::test_schema(2000), base_config(), {}, 63);
  const Schema schema2{{{"x", {5000}, DType::f32}}, "none"};
  auto dir2 = std::make_shared<MemoryDirectory>();
  std::vector<std::vector<float>> data2(n, std::vector<float>(5000));
  std::vector<std::shared_ptr<Averager>> second;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t e = 0; e < 5000; ++e) data2[i][e] = static_cast<float>(i * 10 + e % 7);
    AveragerConfig cfg = base_config();
    cfg.key = {"other", 16, 0};
    for (const auto& a : c.node(i).host->listen_addresses()) cfg.addrs.push_back(a.to_string());
    std::vector<TensorView> views{{"x", data2[i]}};
    // The address sink lets the host dial members it has no connection to yet (without it the
    // test depended on the first averager having connected the hosts already).
    auto a = Averager::create(c.node(i).host, dir2, schema2, views, cfg,
                              starling::averaging::test::address_sink(c.node(i).host));
    ASSERT_TRUE(a) << a.error().message();
    second.push_back(a.value());
    c.node(i).run([a = second.back()]() -> awaitable<int> {
      a->start();
      co_return 0;
    });
  }
  std::vector<std::future<result<StepResult>>> f1, f2;
  StepOptions o;
  o.timeout = 40s;
  o.matchmaking_timeout = 15s;
  for (std::size_t i = 0; i < n; ++i) {
    f1.push_back(test::spawn_future(c.node(i).io, [a = c.node(i).avg, o]() { return a->step(o); }));
    f2.push_back(test::spawn_future(c.node(i).io, [a = second[i], o]() { return a->step(o); }));
  }
  for (std::size_t i = 0; i < n; ++i) {
    auto r1 = f1[i].get();
    auto r2 = f2[i].get();
    ASSERT_TRUE(r1) << r1.error().message();
    ASSERT_TRUE(r2) << r2.error().message();
    EXPECT_EQ(r1.value().group.members.size(), n);
    EXPECT_EQ(r2.value().group.members.size(), n);
  }
  expect_near(c.flat(0), mean_of(c, {0, 1, 2}));
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t e = 0; e < 5000; ++e)
      ASSERT_FLOAT_EQ(data2[i][e], static_cast<float>(10 + e % 7)) << i << " " << e;
  for (std::size_t i = 0; i < n; ++i)
    c.node(i).run([a = second[i]]() -> awaitable<int> {
      co_await a->stop();
      co_return 0;
    });
}

TEST(AveragerKeys, BlobFromSeveralDonorsAndResume) {
  // A 2.4 MB blob (a model with its optimizer state) in 256 KiB parts.
  for (bool kill : {false, true}) {
    Cluster c(4, test::test_schema(10), base_config(), {}, kill ? 65 : 64);
    const Bytes blob = random_blob(2'400'017, 7);
    for (std::size_t i = 0; i < 3; ++i) {
      auto r = c.node(i).run([a = c.node(i).avg, &blob]() {
        return a->share_blob(BlobSnapshot{5, blob, to_bytes("epoch=5")}, 60s);
      });
      ASSERT_TRUE(r) << r.error().message();
    }
    // An older blob elsewhere must not win.
    LoadStateOptions o;
    o.parts_per_request = 1;
    o.stall_timeout = 5s;
    auto fut =
        test::spawn_future(c.node(3).io, [a = c.node(3).avg, o]() { return a->load_blob(o); });
    if (kill) c.kill(1);
    ASSERT_EQ(fut.wait_for(120s), std::future_status::ready);
    auto got = fut.get();
    ASSERT_TRUE(got) << got.error().message();
    EXPECT_EQ(got.value().info.epoch, 5u);
    EXPECT_EQ(as_string(got.value().info.metadata), "epoch=5");
    EXPECT_EQ(got.value().info.parts, 10u);
    EXPECT_TRUE(got.value().data == blob);
    if (!kill) {
      EXPECT_GE(got.value().info.donors, 2u) << "downloaded from one donor only";
    }
    std::printf("%s: %zu parts, %zu retried, %zu donors\n", kill ? "kill" : "all",
                got.value().info.parts, got.value().info.parts_retried, got.value().info.donors);
  }
}

namespace {
struct Source {
  std::shared_ptr<std::atomic<int>> calls;
  std::uint64_t epoch;
  Bytes data;
  awaitable<result<BlobSnapshot>> operator()() const {
    ++*calls;
    BlobSnapshot b;
    b.epoch = epoch;
    b.data = data;
    co_return b;
  }
};
}  // namespace

TEST(AveragerKeys, LazySourceNewestEpochAndLimit) {
  Cluster c(3, test::test_schema(10), base_config(), {}, 66);
  auto calls = std::make_shared<std::atomic<int>>(0);
  const Bytes old_blob = random_blob(300'000, 1), new_blob = random_blob(700'000, 2);
  auto a0 = c.node(0).run([a = c.node(0).avg, calls, &old_blob]() -> awaitable<result<void>> {
    a->set_blob_source(Source{calls, 3, old_blob});
    co_return co_await a->announce_blob(3, 60s);
  });
  auto a1 = c.node(1).run([a = c.node(1).avg, calls, &new_blob]() -> awaitable<result<void>> {
    a->set_blob_source(Source{calls, 4, new_blob});
    co_return co_await a->announce_blob(4, 60s);
  });
  ASSERT_TRUE(a0) << a0.error().message();
  ASSERT_TRUE(a1) << a1.error().message();
  auto got = c.node(2).run([a = c.node(2).avg]() { return a->load_blob({}); });
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(got.value().info.epoch, 4u);
  EXPECT_TRUE(got.value().data == new_blob);
  EXPECT_GE(calls->load(), 2);
  // The same download with a limit below the blob's size is refused with a clear error.
  LoadStateOptions o;
  o.max_bytes = 500'000;
  auto small = c.node(2).run([a = c.node(2).avg, o]() { return a->load_blob(o); });
  ASSERT_TRUE(small) << small.error().message();  // the older 300 kB blob fits
  EXPECT_EQ(small.value().info.epoch, 3u);
  o.max_bytes = 100'000;
  auto none = c.node(2).run([a = c.node(2).avg, o]() { return a->load_blob(o); });
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error(), errc::too_large) << none.error().message();
  // Stopping the source stops serving.
  c.node(1).run([a = c.node(1).avg]() -> awaitable<int> {
    a->set_blob_source(nullptr);
    co_return 0;
  });
  auto after = c.node(2).run([a = c.node(2).avg]() { return a->load_blob({}); });
  ASSERT_TRUE(after) << after.error().message();
  EXPECT_EQ(after.value().info.epoch, 3u);
}
