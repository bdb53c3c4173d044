// State transfer over real loopback Hosts: a newcomer downloads the best announced snapshot
// from several donors in parallel, verifies every part, and survives a donor that leaves or
// stalls mid-download.
#include <gtest/gtest.h>

#include "net_harness.hpp"
#include "starling/averaging/wire.hpp"

using namespace starling;
using namespace starling::averaging;
using starling::averaging::test::Cluster;
using starling::averaging::test::copy_tensors;

TEST(StateTransfer, ManifestCodecAndIds) {
  StateManifest m;
  m.epoch = 7;
  m.metadata = to_bytes("meta");
  m.schema_hash = Bytes(32, 3);
  m.size = 10;
  m.part_size = 4;
  m.part_hashes = {Bytes(32, 1), Bytes(32, 2), Bytes(32, 3)};
  m.snapshot = snapshot_id(m);
  EXPECT_TRUE(validate_manifest(m));
  auto f = wire::decode_state_frame(wire::encode_state_frame(StateFrame{m, {}, 0, {}}));
  ASSERT_TRUE(f) << f.error().message();
  EXPECT_EQ(f.value().manifest->snapshot, m.snapshot);
  auto bad = m;
  bad.part_hashes.pop_back();  // 10 bytes in parts of 4 need 3 hashes
  EXPECT_FALSE(validate_manifest(bad));
  bad = m;
  bad.epoch = 8;  // the id no longer matches the contents
  EXPECT_FALSE(validate_manifest(bad));
  EXPECT_FALSE(wire::decode_state_frame(wire::encode_state_frame(StateFrame{bad, {}, 0, {}})));
  EXPECT_FALSE(wire::decode_state_request(wire::encode_state_request(StateRequest{})));
}

TEST(StateTransfer, NewcomerDownloadsFromSeveralDonors) {
  Cluster c(5, test::test_schema(100000), test::state_config("state"), {}, 41);
  // Donors 0-2 hold the current state (epoch 12); donor 3 an older one (epoch 9).
  copy_tensors(c, 0, 1);
  copy_tensors(c, 0, 2);
  ASSERT_TRUE(test::share_state(c, 0, 12, "step=12"));
  ASSERT_TRUE(test::share_state(c, 1, 12, "step=12"));
  ASSERT_TRUE(test::share_state(c, 2, 12, "step=12"));
  ASSERT_TRUE(test::share_state(c, 3, 9, "step=9"));
  ASSERT_NE(c.flat(4), c.flat(0));
  auto info = c.node(4).run([a = c.node(4).avg]() { return a->load_state({}); });
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_EQ(info.value().epoch, 12u);
  EXPECT_EQ(as_string(info.value().metadata), "step=12");
  EXPECT_GE(info.value().donors, 2u) << "downloaded from one donor only";
  EXPECT_EQ(c.flat(4), c.flat(0));
  std::printf("%zu parts, %zu donors, %.3f s\n", info.value().parts, info.value().donors,
              std::chrono::duration<double>(info.value().time).count());
}

TEST(StateTransfer, DonorLostMidDownload) {
  for (bool stall : {false, true}) {
    Cluster c(4, test::test_schema(400000), test::state_config("state"), {}, 43);
    copy_tensors(c, 0, 1);
    copy_tensors(c, 0, 2);
    for (std::size_t i = 0; i < 3; ++i) ASSERT_TRUE(test::share_state(c, i, 3, "m"));
    LoadStateOptions o;
    o.parts_per_request = 2;
    o.stall_timeout = 2s;
    auto fut =
        test::spawn_future(c.node(3).io, [a = c.node(3).avg, o]() { return a->load_state(o); });
    std::this_thread::sleep_for(300ms);
    if (stall)
      c.stall(1, 6s);
    else
      c.kill(1);
    ASSERT_EQ(fut.wait_for(120s), std::future_status::ready);
    auto info = fut.get();
    ASSERT_TRUE(info) << info.error().message();
    EXPECT_EQ(c.flat(3), c.flat(0));
    std::printf("%s: %zu parts, %zu retried, %zu donors, %.3f s\n", stall ? "stall" : "kill",
                info.value().parts, info.value().parts_retried, info.value().donors,
                std::chrono::duration<double>(info.value().time).count());
  }
}

TEST(StateTransfer, NobodyAnnounces) {
  Cluster c(1, test::test_schema(100), test::state_config("state"), {}, 45);
  auto info = c.node(0).run([a = c.node(0).avg]() { return a->load_state({}); });
  ASSERT_FALSE(info);
  EXPECT_EQ(info.error(), errc::not_found);
}
