// Yamux against misbehaving, silent and dying peers: malformed frames (sent as raw bytes
// from the other end of the TCP connection), keepalive failure, a peer killed mid-stream,
// and close() bounded when the peer never answers.
#include <gtest/gtest.h>

#include <asio/io_context.hpp>

#include "starling/net/yamux.hpp"
#include "support/reference_timer.hpp"
#include "yamux_test_util.hpp"

using namespace starling;
using namespace starling::net;
using starling::test::raw_frame;
using starling::test::run_with_deadline;

namespace {

constexpr std::uint8_t kData = 0, kWindowUpdate = 1, kPing = 2, kGoAway = 3;
constexpr std::uint16_t kSyn = 1, kFin = 4, kRst = 8;

Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

struct MalformedCase {
  const char* name;
  Bytes bytes;  // sent by a raw "client" (odd ids) to a yamux server session
};

std::vector<MalformedCase> malformed_cases() {
  const Bytes four = to_bytes("abcd");
  return {
      {"bad_version", raw_frame(kWindowUpdate, kSyn, 1, 0, {}, /*version=*/1)},
      {"unknown_type", raw_frame(9, 0, 1, 0)},
      {"ping_on_stream", raw_frame(kPing, kSyn, 5, 1)},
      {"data_on_session_id", raw_frame(kData, 0, 0, 4, four)},
      {"data_beyond_window",
       cat({raw_frame(kWindowUpdate, kSyn, 1, 0), raw_frame(kData, 0, 1, 256 * 1024 + 1)})},
      {"data_for_never_opened_stream", raw_frame(kData, 0, 9, 4, four)},
      {"update_for_never_opened_server_stream", raw_frame(kWindowUpdate, 0, 4, 100)},
      {"syn_with_server_parity", raw_frame(kWindowUpdate, kSyn, 2, 0)},
      {"syn_for_open_stream",
       cat({raw_frame(kWindowUpdate, kSyn, 1, 0), raw_frame(kWindowUpdate, kSyn, 1, 0)})},
      {"syn_reusing_closed_id",
       cat({raw_frame(kWindowUpdate, kSyn, 3, 0), raw_frame(kWindowUpdate, kRst, 3, 0),
            raw_frame(kWindowUpdate, kSyn, 3, 0)})},
      {"syn_below_last_id",
       cat({raw_frame(kWindowUpdate, kSyn, 7, 0), raw_frame(kWindowUpdate, kSyn, 5, 0)})},
      {"window_overflow", raw_frame(kWindowUpdate, kSyn, 1, 0xffffffffu)},
      {"data_after_fin",
       cat({raw_frame(kWindowUpdate, kSyn | kFin, 1, 0), raw_frame(kData, 0, 1, 4, four)})},
      {"huge_data_for_closed_stream",
       cat({raw_frame(kWindowUpdate, kSyn, 1, 0), raw_frame(kWindowUpdate, kRst, 1, 0),
            raw_frame(kData, 0, 1, 0xfffffff0u)})},
  };
}

class YamuxMalformed : public ::testing::TestWithParam<std::size_t> {};

}  // namespace

TEST_P(YamuxMalformed, ClosesWithGoAwayProtocolError) {
  const auto c = malformed_cases().at(GetParam());
  SCOPED_TRACE(c.name);
  asio::io_context io;
  auto [raw, conn] = test::tcp_pair(io);
  auto session = YamuxSession::create(conn, /*is_client=*/false);
  std::optional<Error> why;
  session->set_on_close([&](const Error& e) { why = e; });
  session->start();
  run_with_deadline(
      io,
      [&]() -> awaitable<void> {
        EXPECT_TRUE(co_await raw->write(c.bytes));
        // The session answers with GoAway(protocol error = 1) on stream 0 and closes.
        auto ga = co_await test::read_raw_until(*raw, kGoAway);
        EXPECT_TRUE(ga) << ga.error().message();
        if (ga) {
          EXPECT_EQ(ga.value().version, 0);
          EXPECT_EQ(ga.value().id, 0u);
          EXPECT_EQ(ga.value().length, 1u);
        }
        // Then the connection ends (EOF after the GoAway).
        Bytes rest(4096);
        for (;;) {
          auto n = co_await raw->read_some(rest);
          if (!n) break;
        }
        raw->reset();
      },
      10s);
  ASSERT_TRUE(why);
  EXPECT_TRUE(*why == errc::protocol_violation || *why == errc::too_large) << why->message();
  EXPECT_TRUE(session->closed());
  EXPECT_EQ(session->stream_count(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Frames, YamuxMalformed,
                         ::testing::Range<std::size_t>(0, malformed_cases().size()),
                         [](const auto& info) { return malformed_cases()[info.param].name; });

TEST(YamuxFault, DataForAFinishedStreamIsSkippedWithoutLosingSync) {
  asio::io_context io;
  auto [raw, conn] = test::tcp_pair(io);
  auto session = YamuxSession::create(conn, false);
  session->start();
  run_with_deadline(io, [&]() -> awaitable<void> {
    const Bytes junk = test::pattern(100, 3);
    const Bytes bytes =
        cat({raw_frame(kWindowUpdate, kSyn, 1, 0), raw_frame(kWindowUpdate, kRst, 1, 0),
             raw_frame(kData, 0, 1, 100, junk), raw_frame(kData, kSyn, 3, 2, to_bytes("hi"))});
    // Byte by byte, so every frame boundary falls across reads.
    for (std::uint8_t b : bytes) EXPECT_TRUE(co_await raw->write(BytesView(&b, 1)));
    auto s1 = co_await session->accept_stream();  // stream 1 was reset: skipped
    EXPECT_TRUE(s1);
    if (!s1) co_return;
    EXPECT_EQ(yamux_stream_stats(*s1.value())->id, 3u);
    Bytes two(2);
    EXPECT_TRUE(co_await read_exact(*s1.value(), two));
    EXPECT_EQ(as_string(two), "hi");
    EXPECT_FALSE(session->closed());
    s1.value()->reset();
    co_await session->close();
    raw->reset();
  });
}

TEST(YamuxFault, PeerKilledMidStreamFailsPendingOperationsPromptly) {
  asio::io_context io;
  auto p = test::session_pair(io);
  std::optional<Error> why;
  p.client->set_on_close([&](const Error& e) { why = e; });
  run_with_deadline(io, [&]() -> awaitable<void> {
    auto reader = (co_await p.client->open_stream()).value();
    auto writer = (co_await p.client->open_stream()).value();
    auto s1 = (co_await p.server->accept_stream()).value();
    auto s2 = (co_await p.server->accept_stream()).value();
    // Fill the writer's window so its next write blocks on flow control.
    const Bytes window = test::pattern(256 * 1024, 9);
    EXPECT_TRUE(co_await writer->write(window));
    result<std::size_t> r = make_error(errc::internal);
    result<void> w = make_error(errc::internal);
    auto t0 = Clock::now();
    auto read_op = [&]() -> awaitable<result<void>> {
      Bytes buf(10);
      r = co_await reader->read_some(buf);
      co_return success();
    };
    auto write_op = [&]() -> awaitable<result<void>> {
      w = co_await writer->write(as_bytes("more"));
      co_return success();
    };
    auto kill = [&]() -> awaitable<result<void>> {
      (void)co_await sleep_for(20ms);
      p.server_tcp->reset();  // the server process dies: RST on the wire
      co_return success();
    };
    using namespace asio::experimental::awaitable_operators;
    co_await (read_op() && write_op() && kill());
    EXPECT_LT(Clock::now() - t0, 2s);
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_TRUE(r.error() == errc::reset || r.error() == errc::closed) << r.error().message();
    }
    EXPECT_FALSE(w);
    if (!w) {
      EXPECT_TRUE(w.error() == errc::reset || w.error() == errc::closed) << w.error().message();
    }
    auto o = co_await p.client->open_stream();
    EXPECT_FALSE(o);
    co_await p.client->close();
    co_await p.server->close();
  });
  ASSERT_TRUE(why);
  EXPECT_TRUE(p.client->closed());
}

TEST(YamuxFault, SilentPeerFailsKeepaliveAndStreams) {
  asio::io_context io;
  auto [conn, raw] = test::tcp_pair(io);  // raw end never answers
  YamuxConfig cfg;
  cfg.keepalive_interval = 100ms;
  cfg.keepalive_timeout = 200ms;
  cfg.close_timeout = 300ms;
  auto session = YamuxSession::create(conn, true, cfg);
  std::optional<Error> why;
  session->set_on_close([&](const Error& e) { why = e; });
  session->start();
  run_with_deadline(io, [&]() -> awaitable<void> {
    auto st = (co_await session->open_stream()).value();
    const auto t0 = Clock::now();
    Bytes buf(10);
    auto r = co_await st->read_some(buf);
    const auto took = Clock::now() - t0;
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_EQ(r.error(), errc::reset) << r.error().message();
    }
    // The first ping goes out at start; it times out after 200 ms.
    EXPECT_LT(took, 2s);
    auto w = co_await st->write(as_bytes("x"));
    EXPECT_FALSE(w);
    auto a = co_await session->accept_stream();
    EXPECT_FALSE(a);
    if (!a) {
      EXPECT_EQ(a.error(), errc::closed);
    }
    co_await session->close();
    raw->reset();
  });
  ASSERT_TRUE(why);
  EXPECT_EQ(*why, errc::timeout) << why->message();
}

TEST(YamuxFault, CloseIsBoundedWhenThePeerNeverAnswers) {
  asio::io_context io;
  auto [conn, raw] = test::tcp_pair(io);  // raw end never reads nor answers
  YamuxConfig cfg;
  cfg.close_timeout = 500ms;
  auto session = YamuxSession::create(conn, true, cfg);
  session->start();
  run_with_deadline(io, [&]() -> awaitable<void> {
    auto st = (co_await session->open_stream()).value();
    EXPECT_TRUE(co_await st->write(test::pattern(100'000, 4)));
    const auto t0 = Clock::now();
    // A timer of the close timeout on the same executor: how late it fires is the machine's
    // scheduling delay, which the bound must not blame on close().
    test::ReferenceTimer ref(io.get_executor(), cfg.close_timeout);
    co_await session->close();
    const auto took = Clock::now() - t0;
    EXPECT_LE(took, ref.elapsed() + 200ms);
    EXPECT_GE(took, 300ms);  // it did wait for the open stream first
    Bytes buf(1);
    auto r = co_await st->read_some(buf);
    EXPECT_FALSE(r);
    raw->reset();
  });
}

TEST(YamuxFault, DroppingTheSessionAbortsItsStreams) {
  asio::io_context io;
  auto p = test::session_pair(io);
  run_with_deadline(io, [&]() -> awaitable<void> {
    auto c = (co_await p.client->open_stream()).value();
    auto s = (co_await p.server->accept_stream()).value();
    p.client.reset();  // handle dropped without close()
    Bytes buf(1);
    auto r = co_await c->read_some(buf);
    EXPECT_FALSE(r);
    auto r2 = co_await s->read_some(buf);  // the peer sees the session go away
    EXPECT_FALSE(r2);
    co_await p.server->close();
  });
}
