// Yamux sessions over loopback TCP: streams, transfers, half-close, reset, flow control,
// go-away, pings.
#include <gtest/gtest.h>

#include <asio/io_context.hpp>

#include "starling/net/yamux.hpp"
#include "yamux_test_util.hpp"

using namespace starling;
using namespace starling::net;
using starling::test::pattern;
using starling::test::read_all;
using starling::test::run_with_deadline;
using starling::test::session_pair;

namespace {

// Accepts streams on `s` and echoes each one until its FIN (then closes its own side).
awaitable<void> echo_server(std::shared_ptr<YamuxSession> s) {
  for (;;) {
    auto st = co_await s->accept_stream();
    if (!st) co_return;
    asio::co_spawn(
        co_await asio::this_coro::executor,
        [](ByteStreamPtr st) -> awaitable<void> {
          Bytes buf(32 * 1024);
          for (;;) {
            auto n = co_await st->read_some(buf);
            if (!n) break;
            if (!co_await st->write(BytesView(buf).first(n.value()))) co_return;
          }
          (void)co_await st->close_write();
        }(std::move(st.value())),
        asio::detached);
  }
}

std::uint32_t id_of(const ByteStream& s) {
  return yamux_stream_stats(s).value().id;
}

}  // namespace

TEST(Yamux, OpenAcceptEchoAndIdParity) {
  asio::io_context io;
  auto p = session_pair(io);
  run_with_deadline(io, [&]() -> awaitable<void> {
    asio::co_spawn(io, echo_server(p.server), asio::detached);
    std::vector<ByteStreamPtr> streams;
    for (int i = 0; i < 3; ++i) {
      auto st = co_await p.client->open_stream();
      EXPECT_TRUE(st) << st.error().message();
      if (!st) co_return;
      streams.push_back(st.value());
    }
    // Client streams use odd ids, in order.
    EXPECT_EQ(id_of(*streams[0]), 1u);
    EXPECT_EQ(id_of(*streams[1]), 3u);
    EXPECT_EQ(id_of(*streams[2]), 5u);
    EXPECT_EQ(streams[1]->describe(), "yamux stream 3 on " + p.client_tcp->describe());
    for (std::size_t i = 0; i < streams.size(); ++i) {
      const std::string msg = "hello " + std::to_string(i);
      EXPECT_TRUE(co_await streams[i]->write(as_bytes(msg)));
      EXPECT_TRUE(co_await streams[i]->close_write());
      auto back = co_await read_all(*streams[i]);
      EXPECT_TRUE(back);
      if (back) {
        EXPECT_EQ(as_string(back.value()), msg);
      }
    }
    // The server side opens too: even ids.
    asio::co_spawn(io, echo_server(p.client), asio::detached);
    {
      auto st = co_await p.server->open_stream();
      EXPECT_TRUE(st);
      if (st) {
        EXPECT_EQ(id_of(*st.value()), 2u);
      }
    }
    streams.clear();
    co_await p.client->close();
    co_await p.server->close();
  });
  EXPECT_EQ(p.client->stream_count(), 0u);
  EXPECT_TRUE(p.client->closed());
}

TEST(Yamux, TenMegabytesIntactOnOneStream) {
  asio::io_context io;
  auto p = session_pair(io);
  const Bytes data = pattern(10u << 20, 1);
  run_with_deadline(io, [&]() -> awaitable<void> {
    asio::co_spawn(io, echo_server(p.server), asio::detached);
    auto st = co_await p.client->open_stream();
    EXPECT_TRUE(st);
    if (!st) co_return;
    auto s = st.value();
    // Write and read concurrently (the echo needs both directions to flow).
    auto writer = [&]() -> awaitable<result<void>> {
      ST_CO_TRY(co_await test::write_chunked(*s, data, 100'000));
      co_return co_await s->close_write();
    };
    auto reader = [&]() -> awaitable<result<Bytes>> { return read_all(*s); };
    using namespace asio::experimental::awaitable_operators;
    auto [w, r] = co_await (writer() && reader());
    EXPECT_TRUE(w);
    EXPECT_TRUE(r);
    if (r) {
      EXPECT_TRUE(r.value() == data) << "echoed data differs";
    }
    co_await p.client->close();
  });
  auto st = p.client->stats();
  EXPECT_GE(st.data_bytes_sent, data.size());
  EXPECT_GE(st.data_bytes_received, data.size());
}

TEST(Yamux, TenMegabytesOnEachOfEightConcurrentStreams) {
  asio::io_context io;
  auto p = session_pair(io);
  constexpr int kStreams = 8;
  std::vector<Bytes> data;
  for (int i = 0; i < kStreams; ++i) data.push_back(pattern(10u << 20, 100 + i));
  int ok = 0;
  run_with_deadline(
      io,
      [&]() -> awaitable<void> {
        // Server: for each stream, read everything, then answer with its length.
        asio::co_spawn(
            io,
            [&]() -> awaitable<void> {
              for (;;) {
                auto st = co_await p.server->accept_stream();
                if (!st) co_return;
                // Parameters, not captures: the lambda object dies before the coroutine.
                asio::co_spawn(
                    io,
                    [](ByteStreamPtr s, const std::vector<Bytes>* data,
                       int* ok) -> awaitable<void> {
                      auto all = co_await read_all(*s);
                      if (!all) co_return;
                      bool match = false;
                      for (auto& d : *data) match = match || all.value() == d;
                      if (match) ++*ok;
                      (void)co_await s->write(as_bytes(match ? "ok" : "bad"));
                      (void)co_await s->close_write();
                    }(std::move(st.value()), &data, &ok),
                    asio::detached);
              }
            },
            asio::detached);
        int done = 0;
        AsyncEvent all_done(io.get_executor());
        for (int i = 0; i < kStreams; ++i) {
          asio::co_spawn(
              io,
              [&, i]() -> awaitable<void> {
                auto st = co_await p.client->open_stream();
                if (st) {
                  auto s = st.value();
                  EXPECT_TRUE(co_await test::write_chunked(*s, data[i], 256 * 1024));
                  EXPECT_TRUE(co_await s->close_write());
                  auto ans = co_await read_all(*s);
                  EXPECT_TRUE(ans && as_string(ans.value()) == "ok");
                }
                if (++done == kStreams) all_done.set();
              },
              asio::detached);
        }
        (void)co_await all_done.wait();
        co_await p.client->close();
      },
      60s);
  EXPECT_EQ(ok, kStreams);
}

TEST(Yamux, HalfCloseSemantics) {
  asio::io_context io;
  auto p = session_pair(io);
  run_with_deadline(io, [&]() -> awaitable<void> {
    auto c = (co_await p.client->open_stream()).value();
    EXPECT_TRUE(co_await c->write(as_bytes("request")));
    EXPECT_TRUE(co_await c->close_write());
    // Writing after our own FIN is refused.
    auto again = co_await c->write(as_bytes("x"));
    EXPECT_FALSE(again);
    if (!again) {
      EXPECT_EQ(again.error(), errc::closed);
    }

    auto s = (co_await p.server->accept_stream()).value();
    auto req = co_await read_all(*s);  // data, then errc::closed after the FIN
    EXPECT_TRUE(req && as_string(req.value()) == "request");
    Bytes one(1);
    auto after = co_await s->read_some(one);  // stays closed
    EXPECT_FALSE(after);
    if (!after) {
      EXPECT_EQ(after.error(), errc::closed);
    }
    // The other direction still works after the client's FIN.
    EXPECT_EQ(p.server->stream_count(), 1u);
    EXPECT_TRUE(co_await s->write(as_bytes("response")));
    EXPECT_TRUE(co_await s->close_write());
    EXPECT_EQ(p.server->stream_count(), 0u);  // both sides done: removed
    auto resp = co_await read_all(*c);
    EXPECT_TRUE(resp && as_string(resp.value()) == "response");
    EXPECT_EQ(p.client->stream_count(), 0u);
    co_await p.client->close();
  });
}

TEST(Yamux, ResetFailsBothSides) {
  asio::io_context io;
  auto p = session_pair(io);
  run_with_deadline(io, [&]() -> awaitable<void> {
    auto c = (co_await p.client->open_stream()).value();
    EXPECT_TRUE(co_await c->write(as_bytes("partial")));
    auto s = (co_await p.server->accept_stream()).value();
    Bytes buf(100);
    auto n = co_await s->read_some(buf);
    EXPECT_TRUE(n && n.value() == 7);
    // A read pending on the server when the client resets completes with errc::reset.
    auto pending = [&]() -> awaitable<result<std::size_t>> { return s->read_some(buf); };
    auto reset_later = [&]() -> awaitable<result<void>> {
      c->reset();
      co_return success();
    };
    using namespace asio::experimental::awaitable_operators;
    auto [r, unused] = co_await (pending() && reset_later());
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_EQ(r.error(), errc::reset) << r.error().message();
    }
    auto w = co_await s->write(as_bytes("too late"));
    EXPECT_FALSE(w);
    if (!w) {
      EXPECT_EQ(w.error(), errc::reset);
    }
    auto cw = co_await c->write(as_bytes("x"));
    EXPECT_FALSE(cw);
    EXPECT_EQ(p.client->stream_count(), 0u);
    EXPECT_EQ(p.server->stream_count(), 0u);
    c->reset();  // idempotent
    co_await p.client->close();
  });
}

TEST(Yamux, ReaderThatDoesNotReadStallsWriterAtExactlyTheWindow) {
  asio::io_context io;
  auto p = session_pair(io);
  const Bytes data = pattern(1u << 20, 7);
  std::size_t written = 0;
  bool writer_done = false;
  run_with_deadline(io, [&]() -> awaitable<void> {
    auto c = (co_await p.client->open_stream()).value();
    asio::co_spawn(
        io,
        [&]() -> awaitable<void> {
          for (std::size_t off = 0; off < data.size(); off += 4096) {
            if (!co_await c->write(BytesView(data).subspan(off, 4096))) co_return;
            written += 4096;
          }
          (void)co_await c->close_write();
          writer_done = true;
        },
        asio::detached);
    auto s = (co_await p.server->accept_stream()).value();
    // Wait (bounded) until the receiver holds a full window and the sender has no credit.
    const auto deadline = Clock::now() + 5s;
    while (Clock::now() < deadline) {
      auto ss = yamux_stream_stats(*s).value();
      auto cs = yamux_stream_stats(*c).value();
      if (ss.buffered == 256 * 1024 && cs.send_credit == 0) break;
      (void)co_await sleep_for(2ms);
    }
    EXPECT_EQ(yamux_stream_stats(*s)->buffered, 256u * 1024);
    EXPECT_EQ(yamux_stream_stats(*c)->send_credit, 0u);
    EXPECT_EQ(written, 256u * 1024);
    // Still stalled a while later: nothing beyond the window was sent.
    (void)co_await sleep_for(100ms);
    EXPECT_EQ(written, 256u * 1024);
    EXPECT_EQ(yamux_stream_stats(*s)->buffered, 256u * 1024);
    EXPECT_FALSE(writer_done);
    // Reading resumes the writer; everything arrives intact.
    auto all = co_await read_all(*s);
    EXPECT_TRUE(all);
    if (all) {
      EXPECT_TRUE(all.value() == data);
    }
    EXPECT_TRUE(writer_done);
    EXPECT_TRUE(co_await s->close_write());
    co_await p.client->close();
  });
}

TEST(Yamux, PingMeasuresRtt) {
  asio::io_context io;
  auto p = session_pair(io);
  run_with_deadline(io, [&]() -> awaitable<void> {
    for (auto& s : {p.client, p.server}) {
      auto t0 = Clock::now();
      auto rtt = co_await s->ping(2s);
      auto elapsed = Clock::now() - t0;
      EXPECT_TRUE(rtt) << rtt.error().message();
      if (!rtt) continue;
      EXPECT_GT(rtt.value(), Duration::zero());
      EXPECT_LE(rtt.value(), elapsed);
    }
    EXPECT_GT(p.client->stats().rtt, Duration::zero());
    co_await p.client->close();
  });
}

TEST(Yamux, GoAwayStopsNewStreamsAndLetsOpenOnesFinish) {
  asio::io_context io;
  YamuxConfig cfg;
  cfg.close_timeout = 3s;
  auto p = session_pair(io, cfg, cfg);
  std::optional<Error> server_closed, client_closed;
  p.server->set_on_close([&](const Error& e) { server_closed = e; });
  p.client->set_on_close([&](const Error& e) { client_closed = e; });
  run_with_deadline(io, [&]() -> awaitable<void> {
    auto c = (co_await p.client->open_stream()).value();
    auto s = (co_await p.server->accept_stream()).value();
    EXPECT_TRUE(co_await c->write(as_bytes("before close")));
    // The client closes while the stream is open; the stream keeps working until both FINs.
    const auto t0 = Clock::now();
    auto closer = [&]() -> awaitable<result<void>> {
      co_await p.client->close();
      co_return success();
    };
    auto finisher = [&]() -> awaitable<result<void>> {
      Bytes buf(64);
      auto n = co_await s->read_some(buf);
      EXPECT_TRUE(n);
      // The GoAway was queued before the client answers this ping, so once the ping is
      // answered the server knows: no new streams from it.
      EXPECT_TRUE(co_await p.server->ping(2s));
      auto o = co_await p.server->open_stream();
      EXPECT_FALSE(o);
      if (!o) {
        EXPECT_EQ(o.error(), errc::closed);
      }
      EXPECT_TRUE(co_await s->write(as_bytes("reply")));
      EXPECT_TRUE(co_await s->close_write());
      auto r = co_await read_all(*c);
      EXPECT_TRUE(r && as_string(r.value()) == "reply");
      EXPECT_TRUE(co_await c->close_write());
      co_return success();
    };
    using namespace asio::experimental::awaitable_operators;
    co_await (closer() && finisher());
    EXPECT_LT(Clock::now() - t0, 2s);  // finished when the stream did, not at the timeout
    // A new stream cannot be opened on a closed session.
    auto o = co_await p.client->open_stream();
    EXPECT_FALSE(o);
    // The server closes itself once its last stream is done.
    const auto deadline = Clock::now() + 3s;
    while (!server_closed && Clock::now() < deadline) (void)co_await sleep_for(5ms);
  });
  ASSERT_TRUE(client_closed);
  EXPECT_EQ(*client_closed, errc::closed);
  ASSERT_TRUE(server_closed);
  EXPECT_EQ(*server_closed, errc::closed) << server_closed->message();
}

TEST(Yamux, AckBacklogLimitsUnacknowledgedStreams) {
  asio::io_context io;
  YamuxConfig ccfg;
  ccfg.max_unacked_outbound = 2;
  ccfg.open_timeout = 200ms;
  auto p = session_pair(io, ccfg, {});
  run_with_deadline(io, [&]() -> awaitable<void> {
    auto a = co_await p.client->open_stream();
    auto b = co_await p.client->open_stream();
    EXPECT_TRUE(a && b);
    // Nobody accepts on the server: the third open waits and times out.
    auto c = co_await p.client->open_stream();
    EXPECT_FALSE(c);
    if (!c) {
      EXPECT_EQ(c.error(), errc::timeout);
    }
    // Accepting one (which ACKs it) makes room.
    auto acc = [&]() -> awaitable<result<ByteStreamPtr>> { return p.server->accept_stream(); };
    auto opn = [&]() -> awaitable<result<ByteStreamPtr>> { return p.client->open_stream(); };
    using namespace asio::experimental::awaitable_operators;
    auto [x, y] = co_await (acc() && opn());
    EXPECT_TRUE(x);
    EXPECT_TRUE(y);
    for (auto* r : {&a, &b, &x, &y}) {
      if (*r) r->value()->reset();
    }
    co_await p.client->close();
  });
}

TEST(Yamux, InboundStreamLimitAndBacklogAreEnforcedWithRst) {
  asio::io_context io;
  YamuxConfig scfg;
  scfg.max_streams = 3;
  auto p = session_pair(io, {}, scfg);
  run_with_deadline(io, [&]() -> awaitable<void> {
    std::vector<ByteStreamPtr> cs;
    for (int i = 0; i < 5; ++i) cs.push_back((co_await p.client->open_stream()).value());
    std::vector<ByteStreamPtr> ss;
    for (int i = 0; i < 3; ++i) ss.push_back((co_await p.server->accept_stream()).value());
    // The 4th and 5th were answered with RST: reading them on the client fails with reset.
    for (int i = 3; i < 5; ++i) {
      Bytes buf(1);
      auto r = co_await cs[i]->read_some(buf);
      EXPECT_FALSE(r);
      if (!r) {
        EXPECT_EQ(r.error(), errc::reset) << r.error().message();
      }
    }
    EXPECT_EQ(p.server->stats().streams_rejected, 2u);
    EXPECT_EQ(p.server->stream_count(), 3u);
    // The accepted ones work.
    EXPECT_TRUE(co_await cs[0]->write(as_bytes("ok")));
    Bytes two(2);
    EXPECT_TRUE(co_await read_exact(*ss[0], two));
    cs.clear();
    ss.clear();
    co_await p.client->close();
  });
}

TEST(Yamux, AcceptBacklogRejectsBeyondItsSize) {
  asio::io_context io;
  YamuxConfig scfg;
  scfg.accept_backlog = 2;
  auto p = session_pair(io, {}, scfg);
  run_with_deadline(io, [&]() -> awaitable<void> {
    std::vector<ByteStreamPtr> cs;
    for (int i = 0; i < 3; ++i) cs.push_back((co_await p.client->open_stream()).value());
    Bytes buf(1);
    auto r = co_await cs[2]->read_some(buf);  // rejected: backlog of 2 was full
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_EQ(r.error(), errc::reset);
    }
    EXPECT_EQ(p.server->stats().streams_rejected, 1u);
    cs.clear();
    co_await p.client->close();
  });
}

TEST(Yamux, CancelledReadLeavesStreamUsable) {
  asio::io_context io;
  auto p = session_pair(io);
  run_with_deadline(io, [&]() -> awaitable<void> {
    auto c = (co_await p.client->open_stream()).value();
    Bytes buf(16);
    auto r = co_await with_timeout(c->read_some(buf), 50ms, "read");
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_EQ(r.error(), errc::timeout);
    }
    auto s = (co_await p.server->accept_stream()).value();
    EXPECT_TRUE(co_await s->write(as_bytes("late")));
    auto n = co_await c->read_some(buf);
    EXPECT_TRUE(n && n.value() == 4);
    c->reset();
    co_await p.client->close();
  });
}

TEST(Yamux, DroppedStreamIsResetForThePeer) {
  asio::io_context io;
  auto p = session_pair(io);
  run_with_deadline(io, [&]() -> awaitable<void> {
    auto c = (co_await p.client->open_stream()).value();
    auto s = (co_await p.server->accept_stream()).value();
    c.reset();  // dropped without close_write
    Bytes buf(1);
    auto r = co_await s->read_some(buf);
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_EQ(r.error(), errc::reset);
    }
    EXPECT_EQ(p.client->stream_count(), 0u);
    co_await p.client->close();
  });
}

TEST(Yamux, LargerInitialWindowIsAnnouncedWithSynAndAck) {
  asio::io_context io;
  YamuxConfig big;
  big.initial_window = 1u << 20;
  auto p = session_pair(io, big, big);
  run_with_deadline(io, [&]() -> awaitable<void> {
    auto c = (co_await p.client->open_stream()).value();
    auto s = (co_await p.server->accept_stream()).value();
    // The SYN carried 1 MiB - 256 KiB: the server may send 1 MiB at once.
    EXPECT_EQ(yamux_stream_stats(*s)->send_credit, 1u << 20);
    EXPECT_EQ(yamux_stream_stats(*s)->recv_window, 1u << 20);
    // The ACK did the same for the client; a ping round trip makes sure it has arrived.
    EXPECT_TRUE(co_await p.client->ping(2s));
    EXPECT_EQ(yamux_stream_stats(*c)->send_credit, 1u << 20);
    // So 1 MiB goes through without any reads on the other side.
    const Bytes data = pattern(1u << 20, 11);
    auto w = co_await with_timeout(c->write(data), 2s, "write 1 MiB");
    EXPECT_TRUE(w) << w.error().message();
    EXPECT_TRUE(co_await p.server->ping(2s));
    EXPECT_EQ(yamux_stream_stats(*s)->buffered, 1u << 20);
    c->reset();
    s->reset();
    co_await p.client->close();
  });
}
