// Yamux keepalive against a raw peer played by the test (frames written and read by hand):
// each side probes only after its own idle limit without inbound frames (dialer:
// keepalive_interval, listener: keepalive_listener_idle), inbound traffic defers probes, and an
// unanswered probe closes the session with errc::timeout, counted in YamuxStats. Timers are
// milliseconds; the test waits on frames and events with deadlines, never sleeps.
#include <gtest/gtest.h>

#include <asio/io_context.hpp>

#include "starling/net/yamux.hpp"
#include "yamux_test_util.hpp"

using namespace starling;
using namespace starling::net;
using starling::test::raw_frame;
using starling::test::read_raw_until;

namespace {

constexpr std::uint8_t kPing = 2;
constexpr std::uint16_t kSyn = 1, kAck = 2;

struct Case {
  bool is_client;  // the session under test dialled (odd ids) or listened
};

class YamuxKeepalive : public ::testing::TestWithParam<Case> {};

// The next ping frame from the session, with a deadline.
awaitable<result<test::RawHeader>> next_ping(ByteStream& raw, Duration within) {
  co_return co_await with_timeout(read_raw_until(raw, kPing), within, "waiting for a ping");
}

}  // namespace

TEST_P(YamuxKeepalive, ProbesOnlyAfterItsIdleLimitAndClosesWhenUnanswered) {
  const bool client = GetParam().is_client;
  // The limit under test is long enough that scheduling delays on a loaded machine cannot
  // fake an idle period; the other side's limit is short, so using the wrong one shows.
  const Duration limit = 300ms;
  YamuxConfig cfg;
  cfg.keepalive_interval = client ? limit : 10ms;
  cfg.keepalive_listener_idle = client ? 10ms : limit;
  cfg.keepalive_timeout = 150ms;
  cfg.close_timeout = 300ms;
  asio::io_context io;
  auto [conn, raw] = test::tcp_pair(io);
  auto session = YamuxSession::create(conn, client, cfg);
  AsyncEvent closed(io.get_executor());
  std::optional<Error> why;
  session->set_on_close([&](const Error& e) {
    why = e;
    closed.set();
  });
  session->start();
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    // 1. The RTT ping at start, answered.
    auto first = co_await next_ping(*raw, 5s);
    CO_ASSERT_OK(first);
    EXPECT_EQ(first.value().flags, kSyn);
    auto w = co_await raw->write(raw_frame(kPing, kAck, 0, first.value().length));
    CO_ASSERT_OK(w);

    // 2. While the peer keeps sending (its own pings, answered by the session), the session
    //    never probes, for three times its idle limit.
    const TimePoint busy_until = Clock::now() + 3 * limit;
    std::uint32_t opaque = 1000;
    int exchanges = 0;
    // The session's idle clock starts when it receives our last frame, which is after we
    // started writing it: measured from there, the probe can come no earlier than the limit.
    TimePoint last_sent = Clock::now();
    while (Clock::now() < busy_until) {
      last_sent = Clock::now();
      w = co_await raw->write(raw_frame(kPing, kSyn, 0, ++opaque));
      CO_ASSERT_OK(w);
      auto got = co_await next_ping(*raw, 5s);
      CO_ASSERT_OK(got);
      if (got.value().flags != kAck) {
        ADD_FAILURE() << "the session probed although frames kept arriving";
        co_return;
      }
      EXPECT_EQ(got.value().length, opaque);
      ++exchanges;
    }
    EXPECT_GT(exchanges, 0);

    // 3. Silence: the probe comes once nothing has arrived for the idle limit; answered.
    auto probe = co_await next_ping(*raw, 10 * limit);
    CO_ASSERT_OK(probe);
    EXPECT_EQ(probe.value().flags, kSyn);
    EXPECT_GE(Clock::now() - last_sent, limit - 5ms);
    last_sent = Clock::now();
    w = co_await raw->write(raw_frame(kPing, kAck, 0, probe.value().length));
    CO_ASSERT_OK(w);

    // 4. The next probe is not answered: the session closes with a timeout.
    auto unanswered = co_await next_ping(*raw, 10 * limit);
    CO_ASSERT_OK(unanswered);
    EXPECT_GE(Clock::now() - last_sent, limit - 5ms);
    auto c = co_await with_timeout(closed.wait(), 10 * cfg.keepalive_timeout, "close");
    CO_ASSERT_OK(c);
    raw->reset();
  });
  ASSERT_TRUE(why);
  EXPECT_EQ(*why, errc::timeout) << why->message();
  const auto st = session->stats();
  EXPECT_EQ(st.keepalive_probes, 2u);
  EXPECT_EQ(st.keepalive_failures, 1u);
  EXPECT_EQ(st.pings_sent, 3u);  // RTT ping + two probes
  EXPECT_GE(st.pings_answered, 1u);
}

INSTANTIATE_TEST_SUITE_P(Sides, YamuxKeepalive, ::testing::Values(Case{true}, Case{false}),
                         [](const auto& info) {
                           return info.param.is_client ? "Dialer" : "Listener";
                         });
