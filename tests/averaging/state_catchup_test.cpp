// State transfer while the donors move on (a newcomer catching up with a collaboration that
// steps every few hundred ms): a stream keeps serving the snapshot its manifest named after
// newer ones replaced it, and a donor that does not answer its manifest does not hold the
// download beyond a short grace once another donor answered.
#include <gtest/gtest.h>

#include "net_harness.hpp"
#include "starling/averaging/wire.hpp"
#include "starling/net/byte_stream.hpp"

using namespace starling;
using namespace starling::averaging;
using starling::averaging::test::Cluster;
using starling::averaging::test::copy_tensors;

namespace {

// One state stream, driven by hand from node `from` to node `to`.
struct RawStream {
  net::ByteStreamPtr s;
  std::shared_ptr<net::BufferedReader> r;
};

}  // namespace

TEST(StateCatchUp, AStreamKeepsServingTheSnapshotItsManifestNamed) {
  Cluster c(2, test::test_schema(20000), test::state_config("state"), {}, 47);
  ASSERT_TRUE(test::share_state(c, 0, 5, "m5"));
  // A first download connects the two nodes (and checks the ordinary path).
  auto first = c.node(1).run([a = c.node(1).avg]() { return a->load_state({}); });
  ASSERT_TRUE(first) << first.error().message();
  const auto donor = c.node(0).host->local_peer();
  const auto proto = averaging_protocol(kStateProtocol, "state");

  auto raw = std::make_shared<RawStream>();
  auto manifest =
      c.node(1).run([h = c.node(1).host, donor, proto, raw]() -> awaitable<result<StateManifest>> {
        ST_CO_TRY(raw->s, co_await h->open_stream(donor, proto, 10s));
        raw->r = std::make_shared<net::BufferedReader>(*raw->s);
        StateRequest req;
        req.manifest = true;
        ST_CO_TRY(co_await raw->s->write(net::length_prefixed(wire::encode_state_request(req))));
        ST_CO_TRY(auto fb, co_await raw->r->read_length_prefixed(wire::kMaxFrame));
        ST_CO_TRY(auto f, wire::decode_state_frame(fb));
        if (!f.manifest) co_return make_error(errc::unavailable, f.error);
        co_return *f.manifest;
      });
  ASSERT_TRUE(manifest) << manifest.error().message();
  ASSERT_EQ(manifest.value().epoch, 5u);
  ASSERT_GE(manifest.value().part_hashes.size(), 2u);

  // The donor steps twice: the snapshot of epoch 5 is neither its current nor its previous.
  ASSERT_TRUE(test::share_state(c, 0, 6, "m6"));
  ASSERT_TRUE(test::share_state(c, 0, 7, "m7"));

  const auto m = manifest.value();
  auto parts = c.node(1).run([raw, m]() -> awaitable<result<std::size_t>> {
    StateRequest req;
    req.snapshot = m.snapshot;
    for (std::uint32_t p = 0; p < m.part_hashes.size(); ++p) req.parts.push_back(p);
    ST_CO_TRY(co_await raw->s->write(net::length_prefixed(wire::encode_state_request(req))));
    std::size_t good = 0;
    for (std::uint32_t p = 0; p < m.part_hashes.size(); ++p) {
      ST_CO_TRY(auto fb, co_await raw->r->read_length_prefixed(wire::kMaxFrame));
      ST_CO_TRY(auto f, wire::decode_state_frame(fb));
      if (!f.part)
        co_return make_error(errc::unavailable, "part " + std::to_string(p) + ": " + f.error);
      Bytes data(f.payload_len);
      ST_CO_TRY(co_await raw->r->read_exact(MutableBytesView(data.data(), data.size())));
      if (*f.part == p && blake2b_256(data) == m.part_hashes[p]) ++good;
    }
    raw->s->reset();
    co_return good;
  });
  ASSERT_TRUE(parts) << parts.error().message();
  EXPECT_EQ(parts.value(), m.part_hashes.size());
}

TEST(StateCatchUp, AStalledDonorDoesNotHoldTheDownload) {
  Cluster c(4, test::test_schema(20000), test::state_config("state"), {}, 49);
  copy_tensors(c, 0, 1);
  copy_tensors(c, 0, 2);
  for (std::size_t i = 0; i < 3; ++i) ASSERT_TRUE(test::share_state(c, i, 3, "m"));
  c.stall(2, 10s);  // its manifest comes after 10 s at the earliest
  const auto t0 = Clock::now();
  auto info = c.node(3).run([a = c.node(3).avg]() { return a->load_state({}); });
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_EQ(c.flat(3), c.flat(0));
  std::printf("downloaded from %zu donors in %.3f s (one donor stalled 10 s)\n",
              info.value().donors, took);
  // The grace after the first manifest is 300 ms (or as long as that one took): far below the
  // stalled donor's 10 s, with room for a loaded machine.
  EXPECT_LT(took, 6.0);
}
