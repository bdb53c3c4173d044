// State transfer against poisoned donors: one claiming an epoch far ahead of everyone else,
// and one whose data does not match what its metadata promises (LoadStateOptions::verify).
#include <gtest/gtest.h>

#include "net_harness.hpp"

using namespace starling;
using namespace starling::averaging;
using starling::averaging::test::Cluster;
using starling::averaging::test::copy_tensors;

namespace {

// A test digest of float32 bytes (FNV-1a), carried as a donor's metadata.
Bytes digest(BytesView data) {
  std::uint64_t h = 1469598103934665603ull;
  for (auto b : data) h = (h ^ b) * 1099511628211ull;
  return to_bytes(std::to_string(h));
}

Bytes digest_of(Cluster& c, std::size_t i) {
  const auto f = c.flat(i);
  return digest(BytesView(reinterpret_cast<const std::uint8_t*>(f.data()), f.size() * 4));
}

result<void> share(Cluster& c, std::size_t i, std::uint64_t epoch, Bytes meta) {
  return c.node(i).run(
      [a = c.node(i).avg, epoch, meta]() { return a->share_state(epoch, meta, 60s); });
}

}  // namespace

TEST(StatePoison, DonorFarAheadIsRefused) {
  Cluster c(4, test::test_schema(2000), test::state_config("poison"), {}, 61);
  copy_tensors(c, 0, 1);
  ASSERT_TRUE(share(c, 0, 12, digest_of(c, 0)));
  ASSERT_TRUE(share(c, 1, 12, digest_of(c, 0)));
  ASSERT_TRUE(share(c, 2, 12 + 101, digest_of(c, 2)));  // poisoned: 101 epochs ahead
  auto info = c.node(3).run([a = c.node(3).avg]() { return a->load_state({}); });
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_EQ(info.value().epoch, 12u);
  EXPECT_EQ(c.flat(3), c.flat(0));
  // Within the lead, the newest epoch still wins (the rule is about outliers only).
  ASSERT_TRUE(share(c, 2, 12 + 100, digest_of(c, 2)));
  info = c.node(3).run([a = c.node(3).avg]() { return a->load_state({}); });
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_EQ(info.value().epoch, 112u);
  EXPECT_EQ(c.flat(3), c.flat(2));
}

TEST(StatePoison, StateFailingTheCallersCheckIsRefused) {
  Cluster c(4, test::test_schema(2000), test::state_config("poison"), {}, 63);
  copy_tensors(c, 0, 1);
  const Bytes honest = digest_of(c, 0);
  ASSERT_TRUE(share(c, 0, 12, honest));
  ASSERT_TRUE(share(c, 1, 12, honest));
  // Poisoned: the newest epoch, with metadata promising the honest digest over other data.
  ASSERT_TRUE(share(c, 2, 13, honest));
  LoadStateOptions o;
  std::atomic<int> checks{0};
  o.verify = [&checks](const StateManifest& m, BytesView data) -> result<void> {
    ++checks;
    if (digest(data) != m.metadata)
      return make_error(errc::invalid_argument, "digest does not match the metadata");
    return success();
  };
  auto info = c.node(3).run([a = c.node(3).avg, o]() { return a->load_state(o); });
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_EQ(info.value().epoch, 12u);
  EXPECT_EQ(checks.load(), 2) << "the poisoned snapshot first, then the honest one";
  EXPECT_EQ(c.flat(3), c.flat(0));
  // Only liars left: the load fails and leaves the tensors unchanged.
  const auto before = c.flat(3);
  o.max_verify_attempts = 1;
  auto bad = c.node(3).run([a = c.node(3).avg, o]() { return a->load_state(o); });
  EXPECT_FALSE(bad);
  EXPECT_EQ(c.flat(3), before);
}
