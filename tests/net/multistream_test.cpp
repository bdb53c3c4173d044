#include <gtest/gtest.h>

#include "starling/net/multistream.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

TEST(Multistream, CodecRoundTripAndRejections) {
  auto enc = multistream_encode("/noise");
  EXPECT_EQ(enc.size(), 1u + 7u);
  EXPECT_EQ(enc[0], 7);
  auto d = multistream_decode(enc);
  ASSERT_TRUE(d && d.value());
  EXPECT_EQ(d.value()->text, "/noise");
  EXPECT_EQ(d.value()->consumed, enc.size());
  // Partial input: need more.
  auto part = multistream_decode(BytesView(enc).first(4));
  ASSERT_TRUE(part);
  EXPECT_FALSE(part.value());
  // Missing newline.
  Bytes bad{3, 'a', 'b', 'c'};
  EXPECT_EQ(multistream_decode(bad).error(), errc::protocol_violation);
  // Too long.
  Bytes big;
  append_uvarint(big, 5000);
  EXPECT_EQ(multistream_decode(big).error(), errc::too_large);
  // Empty message.
  Bytes empty{0};
  EXPECT_FALSE(multistream_decode(empty));
  // Embedded newline.
  Bytes nl{3, 'a', '\n', '\n'};
  EXPECT_FALSE(multistream_decode(nl));
}

namespace {
awaitable<result<Negotiated>> dial(ByteStreamPtr s) {
  std::vector<std::string> protos{"/x/2.0.0", "/x/1.0.0"};
  auto r = co_await multistream_select(s, protos, 5s);
  if (r) {
    Bytes hello = to_bytes("hello");
    ST_CO_TRY(co_await r.value().stream->write(hello));
  }
  co_return r;
}
awaitable<result<Negotiated>> listen(ByteStreamPtr s) {
  co_return co_await multistream_handle(
      s, [](std::string_view p) { return p == "/x/1.0.0"; }, 5s);
}
}  // namespace

TEST(Multistream, NegotiatesFirstSupportedAndKeepsTrailingBytes) {
  asio::io_context io;
  auto [a, b] = test::tcp_pair(io);
  test::run_with_deadline(io, [a = a, b = b]() -> awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto [d, l] = co_await (dial(a) && listen(b));
    EXPECT_TRUE(d) << d.error().message();
    EXPECT_TRUE(l) << l.error().message();
    EXPECT_EQ(d.value().protocol, "/x/1.0.0");
    EXPECT_EQ(l.value().protocol, "/x/1.0.0");
    std::array<std::uint8_t, 5> buf{};
    auto rr = co_await read_exact(*l.value().stream, buf);
    EXPECT_TRUE(rr);
    EXPECT_EQ(as_string(buf), "hello");
  });
}

TEST(Multistream, NoCommonProtocolIsUnsupported) {
  asio::io_context io;
  auto [a, b] = test::tcp_pair(io);
  test::run_with_deadline(io, [a = a, b = b]() -> awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    std::vector<std::string> nope{"/nope/1"};
    auto [d, l] = co_await (multistream_select(a, nope, 5s) &&
                            multistream_handle(
                                b, [](std::string_view) { return false; }, 2s));
    CO_ASSERT_FALSE(d);
    EXPECT_EQ(d.error(), errc::unsupported);
    EXPECT_FALSE(l);
  });
}

TEST(Multistream, GarbageAndSilenceFailWithinDeadline) {
  asio::io_context io;
  auto [a, b] = test::tcp_pair(io);
  test::run_with_deadline(io, [a = a, b = b]() -> awaitable<void> {
    // Garbage header.
    Bytes junk = multistream_encode("/not-multistream");
    auto w = co_await a->write(junk);
    CO_ASSERT_OK(w);
    auto r = co_await multistream_handle(
        b, [](std::string_view) { return true; }, 5s);
    CO_ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), errc::protocol_violation);
  });
  asio::io_context io2;
  auto [c, d] = test::tcp_pair(io2);
  test::run_with_deadline(io2, [c = c, d = d]() -> awaitable<void> {
    auto t0 = Clock::now();
    auto r = co_await multistream_handle(
        d, [](std::string_view) { return true; }, 100ms);
    CO_ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), errc::timeout);
    EXPECT_LT(Clock::now() - t0, 2s);
  });
}
