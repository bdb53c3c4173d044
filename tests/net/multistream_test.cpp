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

// ------------------------------------------------------------------ lazy (optimistic) select

namespace {
constexpr std::string_view kLazy = "/x/1.0.0";

Bytes lazy_prelude() {
  Bytes b = multistream_encode(kMultistreamHeader);
  auto p = multistream_encode(kLazy);
  b.insert(b.end(), p.begin(), p.end());
  return b;
}
Bytes concat(Bytes a, BytesView b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
awaitable<result<Negotiated>> listen_and_greet(ByteStreamPtr b) {
  auto l = co_await multistream_handle(
      b, [](std::string_view p) { return p == kLazy; }, 5s);
  if (l) ST_CO_TRY(co_await l.value().stream->write(as_bytes("hello")));
  co_return l;
}
// A strict dialer that waits for the listener's header before it proposes.
awaitable<result<void>> dial_in_two_steps(ByteStreamPtr a) {
  ST_CO_TRY(co_await a->write(multistream_encode(kMultistreamHeader)));
  auto header = multistream_encode(kMultistreamHeader);
  Bytes got(header.size());
  ST_CO_TRY(co_await read_exact(*a, got));
  if (got != header) co_return make_error(errc::protocol_violation, "header");
  auto proposal = multistream_encode(kLazy);
  ST_CO_TRY(co_await a->write(proposal));
  Bytes echo(proposal.size());
  ST_CO_TRY(co_await read_exact(*a, echo));
  if (echo != proposal) co_return make_error(errc::protocol_violation, "echo");
  co_return success();
}
awaitable<void> write_and_flag(ByteStreamPtr s, const Bytes& data, bool& written,
                               AsyncEvent& done) {
  auto w = co_await s->write(data);
  EXPECT_TRUE(w) << w.error().message();
  written = true;
  done.set();
}
}  // namespace

TEST(MultistreamLazy, ParseAnswer) {
  auto echo = concat(lazy_prelude(), as_bytes("rest"));
  auto ok = multistream_parse_answer(echo, kLazy);
  ASSERT_TRUE(ok && ok.value());
  EXPECT_EQ(*ok.value(), lazy_prelude().size());
  for (std::size_t n = 0; n < lazy_prelude().size(); ++n) {
    auto part = multistream_parse_answer(BytesView(echo).first(n), kLazy);
    ASSERT_TRUE(part) << n;
    EXPECT_FALSE(part.value()) << n;
  }
  auto na = concat(multistream_encode(kMultistreamHeader), multistream_encode("na"));
  EXPECT_EQ(multistream_parse_answer(na, kLazy).error(), errc::unsupported);
  auto other = concat(multistream_encode(kMultistreamHeader), multistream_encode("/y/1.0.0"));
  EXPECT_EQ(multistream_parse_answer(other, kLazy).error(), errc::protocol_violation);
  auto bad_header = concat(multistream_encode("/multistream/2.0.0"), multistream_encode(kLazy));
  EXPECT_EQ(multistream_parse_answer(bad_header, kLazy).error(), errc::protocol_violation);
}

// The request leaves before any answer exists: the listener reads header, proposal and request
// while it has written nothing, so the stream costs no round trip before its first data.
TEST(MultistreamLazy, RequestTravelsWithTheProposalBeforeAnyAnswer) {
  asio::io_context io;
  auto [a, b] = test::tcp_pair(io);
  test::run_with_deadline(io, [a = a, b = b]() -> awaitable<void> {
    auto s = multistream_select_lazy(a, std::string(kLazy));
    CO_ASSERT_OK(co_await s->write(as_bytes("request")));
    auto expect = concat(lazy_prelude(), as_bytes("request"));
    Bytes got(expect.size());
    CO_ASSERT_OK(co_await read_exact(*b, got));  // the listener has sent nothing so far
    EXPECT_EQ(got, expect);
    // Answer and response in one write; the dialer's reads yield only the response.
    auto answer = concat(lazy_prelude(), as_bytes("response"));
    CO_ASSERT_OK(co_await b->write(answer));
    std::array<std::uint8_t, 8> buf{};
    CO_ASSERT_OK(co_await read_exact(*s, buf));
    EXPECT_EQ(as_string(buf), "response");
  });
}

TEST(MultistreamLazy, WorksAgainstTheListenerAndForReadFirstProtocols) {
  asio::io_context io;
  auto [a, b] = test::tcp_pair(io);
  test::run_with_deadline(io, [a = a, b = b]() -> awaitable<void> {
    // Nothing written: the first read sends the proposal itself.
    auto s = multistream_select_lazy(a, std::string(kLazy));
    using namespace asio::experimental::awaitable_operators;
    std::array<std::uint8_t, 5> buf{};
    auto [r, l] = co_await (read_exact(*s, buf) && listen_and_greet(b));
    CO_ASSERT_OK(l);
    CO_ASSERT_OK(r);
    EXPECT_EQ(as_string(buf), "hello");
    // And the other way: data after the lazy proposal reaches the listener's stream.
    CO_ASSERT_OK(co_await s->write(as_bytes("world")));
    CO_ASSERT_OK(co_await read_exact(*l.value().stream, buf));
    EXPECT_EQ(as_string(buf), "world");
  });
}

// A refusal is errc::unsupported naming the protocol, on reads and writes, whatever the data
// that followed the proposal looks like to the listener (here: a malformed message, then
// bytes announcing a message that never completes).
TEST(MultistreamLazy, RefusalIsAClearErrorForThatStream) {
  const std::vector<Bytes> requests = {Bytes{3, 'a', 'b', 'c'}, Bytes{0x68, 'x'}};
  for (const auto& request : requests) {
    asio::io_context io;
    auto [a, b] = test::tcp_pair(io);
    test::run_with_deadline(io, [a = a, b = b, request]() -> awaitable<void> {
      auto s = multistream_select_lazy(a, std::string(kLazy));
      CO_ASSERT_OK(co_await s->write(request));
      using namespace asio::experimental::awaitable_operators;
      std::array<std::uint8_t, 4> buf{};
      auto [r, l] =
          co_await (read_exact(*s, buf) && multistream_handle(
                                               b, [](std::string_view) { return false; }, 5s));
      CO_ASSERT_FALSE(r);
      EXPECT_EQ(r.error(), errc::unsupported) << r.error().message();
      EXPECT_NE(r.error().message().find(std::string(kLazy)), std::string::npos)
          << r.error().message();
      EXPECT_FALSE(l);
      auto w = co_await s->write(as_bytes("more"));
      CO_ASSERT_FALSE(w);
      EXPECT_EQ(w.error(), errc::unsupported);
    });
  }
}

// At most kLazyOptimisticBytes leave before the answer; the rest of a large write waits for
// it, so a refused stream never blocks on flow control.
TEST(MultistreamLazy, LargeWriteWaitsForTheAnswerPastTheOptimisticBudget) {
  asio::io_context io;
  auto [a, b] = test::tcp_pair(io);
  test::run_with_deadline(io, [a = a, b = b]() -> awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto s = multistream_select_lazy(a, std::string(kLazy));
    Bytes data(3 * kLazyOptimisticBytes);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 7);
    bool written = false;
    AsyncEvent done(ex);
    TaskScope scope(ex);
    scope.spawn(write_and_flag(s, data, written, done));
    Bytes got(lazy_prelude().size() + kLazyOptimisticBytes);
    CO_ASSERT_OK(co_await read_exact(*b, got));
    EXPECT_FALSE(written);  // it cannot finish: no answer was sent yet
    EXPECT_TRUE(std::equal(data.begin(), data.begin() + kLazyOptimisticBytes,
                           got.begin() + static_cast<std::ptrdiff_t>(lazy_prelude().size())));
    CO_ASSERT_OK(co_await b->write(lazy_prelude()));
    Bytes rest(data.size() - kLazyOptimisticBytes);
    CO_ASSERT_OK(co_await read_exact(*b, rest));
    EXPECT_TRUE(std::equal(rest.begin(), rest.end(), data.begin() + kLazyOptimisticBytes));
    CO_ASSERT_OK(co_await with_timeout(done.wait(), 10s, "write"));
    EXPECT_TRUE(written);
  });
}

// The listener holds its header back to send it with the answer only when the proposal is
// already there: a dialer that waits for the header before proposing still gets it alone.
TEST(MultistreamLazy, ListenerStillGreetsADialerThatWaitsForTheHeader) {
  asio::io_context io;
  auto [a, b] = test::tcp_pair(io);
  test::run_with_deadline(io, [a = a, b = b]() -> awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto [d, l] = co_await (dial_in_two_steps(a) &&
                            multistream_handle(
                                b, [](std::string_view p) { return p == kLazy; }, 5s));
    CO_ASSERT_OK(d);
    CO_ASSERT_OK(l);
  });
}
