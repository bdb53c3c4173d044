// Pure parts of yamux: the frame header codec and the flow-control bookkeeping.
#include <gtest/gtest.h>

#include "net/yamux_flow.hpp"
#include "net/yamux_frame.hpp"
#include "yamux_test_util.hpp"

using namespace starling;
using namespace starling::net::yamux;

TEST(YamuxFrame, EncodesTheSpecLayout) {
  // Window update, SYN|ACK, stream 0x01020304, length 0x0a0b0c0d, built by hand per spec.md.
  FrameHeader h{FrameType::window_update, flag::syn | flag::ack, 0x01020304, 0x0a0b0c0d};
  std::uint8_t out[kHeaderSize];
  encode_header(h, out);
  const Bytes expect = test::raw_frame(1, 0x0003, 0x01020304, 0x0a0b0c0d);
  EXPECT_EQ(Bytes(out, out + kHeaderSize), expect);
  auto back = decode_header(expect);
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back.value(), h);
}

TEST(YamuxFrame, DecodesEveryTypeAndFlag) {
  for (std::uint8_t type = 0; type <= 3; ++type) {
    const std::uint32_t id = type >= 2 ? 0 : 7;
    for (std::uint16_t flags : {0x0, 0x1, 0x2, 0x4, 0x8, 0xf}) {
      auto h = decode_header(test::raw_frame(type, flags, id, 12345));
      ASSERT_TRUE(h) << h.error().message();
      EXPECT_EQ(static_cast<int>(h.value().type), type);
      EXPECT_EQ(h.value().flags, flags);
      EXPECT_EQ(h.value().stream_id, id);
      EXPECT_EQ(h.value().length, 12345u);
    }
  }
}

TEST(YamuxFrame, RejectsWhatTheSpecForbids) {
  auto bad_version = decode_header(test::raw_frame(0, 0, 1, 0, {}, /*version=*/1));
  ASSERT_FALSE(bad_version);
  EXPECT_EQ(bad_version.error(), errc::protocol_violation);
  auto bad_type = decode_header(test::raw_frame(4, 0, 1, 0));
  ASSERT_FALSE(bad_type);
  EXPECT_EQ(bad_type.error(), errc::protocol_violation);
  EXPECT_FALSE(decode_header(test::raw_frame(2, 1, 5, 0)));  // ping on a stream
  EXPECT_FALSE(decode_header(test::raw_frame(3, 0, 1, 0)));  // go-away on a stream
  EXPECT_FALSE(decode_header(test::raw_frame(0, 0, 0, 4)));  // data on the session id
  EXPECT_FALSE(decode_header(test::raw_frame(1, 0, 0, 4)));  // window update on id 0
  EXPECT_FALSE(decode_header(Bytes(11, 0)));                 // short
}

namespace {
const AutoTune kTune{true, 16u << 20};
const TimePoint t0{};
}  // namespace

TEST(YamuxFlow, ReceiveWindowEnforcesCredit) {
  WindowBudget budget(64u << 20);
  RecvWindow w(kInitialWindow, t0);
  EXPECT_EQ(w.credit(), kInitialWindow);
  EXPECT_TRUE(w.on_data(kInitialWindow - 10));
  EXPECT_FALSE(w.on_data(11));  // one byte beyond the window
  EXPECT_TRUE(w.on_data(10));
  EXPECT_FALSE(w.on_data(1));
  EXPECT_EQ(w.credit(), 0u);
  // Nothing consumed yet: no update due, even if asked.
  EXPECT_EQ(w.take_update(t0 + 1s, 0ms, kTune, budget, false), 0u);
  // Consuming less than half the window sends nothing; reaching half sends exactly that.
  w.on_consumed(kInitialWindow / 2 - 1);
  EXPECT_FALSE(w.update_due());
  EXPECT_EQ(w.take_update(t0 + 1s, 0ms, kTune, budget, false), 0u);
  w.on_consumed(1);
  EXPECT_TRUE(w.update_due());
  EXPECT_EQ(w.take_update(t0 + 1s, 0ms, kTune, budget, false), kInitialWindow / 2);
  EXPECT_EQ(w.credit(), kInitialWindow / 2);
  EXPECT_EQ(w.window(), kInitialWindow);  // no RTT known: no growth
}

TEST(YamuxFlow, LargerInitialWindowIsAnnouncedByTheFirstUpdate) {
  WindowBudget budget(0);
  RecvWindow w(1u << 20, t0);
  EXPECT_EQ(w.credit(), kInitialWindow);  // what the peer assumes until told
  EXPECT_EQ(w.take_update(t0, 0ms, kTune, budget, true), (1u << 20) - kInitialWindow);
  EXPECT_EQ(w.credit(), 1u << 20);
  EXPECT_TRUE(w.on_data(1u << 20));
}

TEST(YamuxFlow, AutoTuneDoublesWhenUpdatesComeWithinTwoRtts) {
  WindowBudget budget(64u << 20);
  RecvWindow w(kInitialWindow, t0);
  const Duration rtt = 10ms;
  TimePoint now = t0;
  std::uint64_t window = kInitialWindow;
  // Each round: the peer fills the window, we consume half and update 5 ms (< 2 RTT) later.
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(w.on_data(w.credit()));
    w.on_consumed(w.held());
    now += 5ms;
    const std::uint64_t before = w.window();
    const std::uint32_t delta = w.take_update(now, rtt, kTune, budget, false);
    const std::uint64_t expect = std::min<std::uint64_t>(before * 2, kTune.max_window);
    EXPECT_EQ(w.window(), expect) << "round " << i;
    EXPECT_EQ(delta, w.window());  // everything consumed is returned plus the growth
    window = w.window();
  }
  EXPECT_EQ(window, kTune.max_window);
  EXPECT_EQ(budget.used(), kTune.max_window - kInitialWindow);
  EXPECT_EQ(w.grown(), kTune.max_window - kInitialWindow);
}

TEST(YamuxFlow, NoGrowthWhenUpdatesAreSlowOrDisabledOrOverBudget) {
  const Duration rtt = 10ms;
  {
    WindowBudget budget(64u << 20);
    RecvWindow w(kInitialWindow, t0);
    ASSERT_TRUE(w.on_data(kInitialWindow));
    w.on_consumed(kInitialWindow);
    EXPECT_EQ(w.take_update(t0 + 25ms, rtt, kTune, budget, false), kInitialWindow);
    EXPECT_EQ(w.window(), kInitialWindow);  // 25 ms >= 2 RTT: not window-limited
  }
  {
    WindowBudget budget(64u << 20);
    RecvWindow w(kInitialWindow, t0);
    ASSERT_TRUE(w.on_data(kInitialWindow));
    w.on_consumed(kInitialWindow);
    (void)w.take_update(t0 + 1ms, rtt, AutoTune{false, 16u << 20}, budget, false);
    EXPECT_EQ(w.window(), kInitialWindow);
  }
  {
    WindowBudget budget(kInitialWindow - 1);  // cannot cover one doubling
    RecvWindow w(kInitialWindow, t0);
    ASSERT_TRUE(w.on_data(kInitialWindow));
    w.on_consumed(kInitialWindow);
    (void)w.take_update(t0 + 1ms, rtt, kTune, budget, false);
    EXPECT_EQ(w.window(), kInitialWindow);
    EXPECT_EQ(budget.used(), 0u);
  }
}

TEST(YamuxFlow, AutoTuneDoublesWhenThePeerRunsOutOfCreditWhileWeKeepUp) {
  // No RTT sample at all (loopback, or before the first ping): the starvation rule alone.
  WindowBudget budget(64u << 20);
  RecvWindow w(kInitialWindow, t0);
  TimePoint now = t0;
  for (int i = 0; i < 12; ++i) {
    // The peer sends its whole credit in frames that we read as they come.
    const std::uint64_t before = w.window();
    while (w.credit() > 0) {
      ASSERT_TRUE(w.on_data(std::min<std::uint32_t>(w.credit(), 64 * 1024)));
      w.on_consumed(w.held());
    }
    now += 1s;  // however long it took
    (void)w.take_update(now, 0ms, kTune, budget, false);
    EXPECT_EQ(w.window(), std::min<std::uint64_t>(before * 2, kTune.max_window)) << "round " << i;
  }
  EXPECT_EQ(w.window(), kTune.max_window);
  // A reader that lags (more than half the window unread when the credit runs out) is the
  // bottleneck itself: no growth.
  RecvWindow slow(kInitialWindow, t0);
  ASSERT_TRUE(slow.on_data(kInitialWindow / 4));
  slow.on_consumed(kInitialWindow / 4);
  ASSERT_TRUE(slow.on_data(slow.credit()));
  slow.on_consumed(slow.held());
  (void)slow.take_update(t0 + 1s, 0ms, kTune, budget, false);
  EXPECT_EQ(slow.window(), kInitialWindow);
  // Credit not used up: no growth either.
  RecvWindow idle(kInitialWindow, t0);
  ASSERT_TRUE(idle.on_data(kInitialWindow - 1));
  idle.on_consumed(kInitialWindow - 1);
  (void)idle.take_update(t0 + 1s, 0ms, kTune, budget, false);
  EXPECT_EQ(idle.window(), kInitialWindow);
}

TEST(YamuxFlow, SendWindowRejectsOverflow) {
  SendWindow s;
  EXPECT_EQ(s.credit(), kInitialWindow);
  s.consume(1000);
  EXPECT_EQ(s.credit(), kInitialWindow - 1000);
  EXPECT_TRUE(s.on_update(1000));
  EXPECT_EQ(s.credit(), kInitialWindow);
  EXPECT_TRUE(s.on_update(0xffffffffu - kInitialWindow));
  auto over = s.on_update(1);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error(), errc::protocol_violation);
}
