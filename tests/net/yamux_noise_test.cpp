// yamux over a Noise channel on loopback: payload is decrypted straight into the buffers of
// waiting readers (ByteStream::read_buffered), and data still arrives intact and in order on
// several concurrent streams whatever the readers' buffer sizes.
#include <gtest/gtest.h>

#include <asio/experimental/awaitable_operators.hpp>

#include "starling/net/noise.hpp"
#include "starling/net/yamux.hpp"
#include "support/tcp_pair.hpp"
#include "yamux_test_util.hpp"

using namespace starling;
using namespace starling::net;
using namespace asio::experimental::awaitable_operators;

namespace {

using test::pattern;

awaitable<result<void>> send(ByteStreamPtr s, Bytes data) {
  ST_CO_TRY(co_await s->write(data));
  co_return co_await s->close_write();
}

using Received = std::tuple<result<Bytes>, result<Bytes>>;

// Accepts two streams (in SYN order), then reads both at once: the first with large reads
// (mostly direct), the second with reads of 1000 bytes, smaller than a Noise frame (decrypted
// in place, then handed out in pieces).
awaitable<result<Received>> accept_and_read(std::shared_ptr<YamuxSession> b) {
  ST_CO_TRY(auto t1, co_await b->accept_stream());
  ST_CO_TRY(auto t2, co_await b->accept_stream());
  co_return co_await (test::read_all(*t1, 1 << 20) && test::read_all(*t2, 1000));
}

}  // namespace

TEST(YamuxOverNoise, PayloadGoesStraightIntoReadersBuffersIntact) {
  asio::io_context io;
  auto ka = crypto::KeyPair::generate(), kb = crypto::KeyPair::generate();
  auto [x, y] = test::tcp_pair(io);
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    auto [ca, cb] = co_await (noise_secure_outbound(x, ka, std::nullopt, 10s) &&
                              noise_secure_inbound(y, kb, 10s));
    CO_ASSERT_TRUE(ca && cb);
    auto a = YamuxSession::create(ca.value().stream, true);
    auto b = YamuxSession::create(cb.value().stream, false);
    a->start();
    b->start();
    const std::size_t n = 3 * 1024 * 1024 + 12345;
    auto s1 = co_await a->open_stream();
    auto s2 = co_await a->open_stream();
    CO_ASSERT_TRUE(s1 && s2);
    Bytes d1 = pattern(n, 1), d2 = pattern(n, 2);
    auto [w1, w2, got] =
        co_await (send(s1.value(), d1) && send(s2.value(), d2) && accept_and_read(b));
    EXPECT_TRUE(w1);
    EXPECT_TRUE(w2);
    CO_ASSERT_TRUE(got);
    auto& [r1, r2] = got.value();
    CO_ASSERT_TRUE(r1 && r2);
    EXPECT_TRUE(r1.value() == d1);
    EXPECT_TRUE(r2.value() == d2);
    const auto st = b->stats();
    EXPECT_EQ(st.data_bytes_received, 2 * n);
    EXPECT_GT(st.data_bytes_direct, 0u);
    EXPECT_LE(st.data_bytes_direct, st.data_bytes_received);
    co_await a->close();
    co_await b->close();
  });
}
