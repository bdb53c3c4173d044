// The frames of streamed calls (stream.hpp) alone: the slicer's frames reassemble exactly;
// truncated, reordered, overrunning, oversized, mis-shaped and non-finite streams are refused.
#include <gtest/gtest.h>

#include <limits>

#include "moe/stream_frames.hpp"

namespace starling::moe {
namespace {

using namespace test;

TEST(MoeStreamFrames, SlicedTensorsReassembleExactly) {
  std::vector<TensorData> ts{ramp({7, 3}), ramp({7, 5})};
  auto frames = slice(ts, 4);
  EXPECT_EQ(frames.size(), 1u + 6 + 9);  // header, ceil(21/4), ceil(35/4)
  StreamAssembler a(WireLimits{});
  for (const auto& f : frames) ASSERT_TRUE(a.feed(f));
  ASSERT_TRUE(a.complete());
  ASSERT_TRUE(a.finish());
  EXPECT_EQ(a.header().uid, "ffn.0");
  auto got = a.take();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].shape, ts[0].shape);
  EXPECT_EQ(got[0].values, ts[0].values);
  EXPECT_EQ(got[1].values, ts[1].values);
}

TEST(MoeStreamFrames, BadStreamsRefused) {
  std::vector<TensorData> ts{ramp({4, 8})};
  auto frames = slice(ts, 10);  // header + 4 chunks
  ASSERT_EQ(frames.size(), 5u);
  {  // truncated: the stream ends before the last chunk
    StreamAssembler a(WireLimits{});
    for (std::size_t i = 0; i + 1 < frames.size(); ++i) ASSERT_TRUE(a.feed(frames[i]));
    auto r = a.finish();
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), errc::protocol_violation);
    EXPECT_NE(r.error().message().find("ended at value 30"), std::string::npos);
  }
  {  // a chunk skipped, a chunk repeated, a chunk before the header, a second header
    StreamAssembler a(WireLimits{});
    ASSERT_TRUE(a.feed(frames[0]));
    ASSERT_TRUE(a.feed(frames[1]));
    EXPECT_EQ(a.feed(frames[3]).error(), errc::protocol_violation);
    EXPECT_FALSE(a.feed(frames[2]));  // refused for good after an error
    StreamAssembler b(WireLimits{});
    EXPECT_EQ(b.feed(frames[1]).error(), errc::protocol_violation);
    StreamAssembler c(WireLimits{});
    ASSERT_TRUE(c.feed(frames[0]));
    EXPECT_EQ(c.feed(frames[0]).error(), errc::protocol_violation);
  }
  {  // a chunk overrunning its tensor: the header says fewer values than the chunks carry
    auto small = slice({ramp({3, 8})}, 10);
    StreamAssembler a(WireLimits{});
    ASSERT_TRUE(a.feed(small[0]));
    ASSERT_TRUE(a.feed(frames[1]));
    ASSERT_TRUE(a.feed(frames[2]));
    auto r = a.feed(frames[3]);  // values 20..29 of a 24-value tensor
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message().find("overruns"), std::string::npos) << r.error().message();
  }
  {  // oversized: a tensor over max_stream_elements, a chunk over max_chunk_elements
    WireLimits l;
    l.max_stream_elements = 31;
    EXPECT_EQ(StreamAssembler(l).feed(frames[0]).error(), errc::too_large);
    l = WireLimits{};
    l.max_chunk_elements = 9;
    StreamAssembler a(l);
    ASSERT_TRUE(a.feed(frames[0]));
    EXPECT_EQ(a.feed(frames[1]).error(), errc::too_large);
  }
  {  // mis-shaped: the caller's check sees the header before anything is allocated
    StreamAssembler a(WireLimits{}, [](const StreamHeader& h) -> result<void> {
      if (h.shapes.at(0).at(1) != 16) return Error(errc::invalid_argument, "want [N, 16]");
      return success();
    });
    EXPECT_EQ(a.feed(frames[0]).error(), errc::invalid_argument);
  }
  {  // non-finite values are refused by the slicer and by the assembler
    auto bad = ramp({2, 2});
    bad.values[3] = std::numeric_limits<float>::infinity();
    pb::MoeStreamHeader h;
    StreamSlicer s(h, {bad.shape}, {std::span<const float>(bad.values)}, {}, 8);
    ASSERT_TRUE(s.next());  // the header
    EXPECT_EQ(s.next().error(), errc::invalid_argument);
  }
}

}  // namespace
}  // namespace starling::moe
