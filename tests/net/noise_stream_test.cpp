// Noise over real loopback sockets: the async handshake (both orders, wrong peer, tampering,
// peers that close or never answer) and the encrypted stream (sizes at frame boundaries,
// full duplex, tampered and truncated frames, half-close), plus a throughput figure.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include <asio/experimental/awaitable_operators.hpp>

#include "net/noise_stream.hpp"
#include "starling/net/noise.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;
using namespace asio::experimental::awaitable_operators;

namespace {

// Fails the current test and leaves the coroutine (gtest's ASSERT_* cannot co_return).
#define NOISE_CO_REQUIRE(cond)                     \
  if (!(cond)) {                                   \
    ADD_FAILURE() << "requirement failed: " #cond; \
    co_return;                                     \
  }

// Forwards to a stream, flipping one byte of what is read at a chosen offset.
class TamperStream final : public ByteStream {
 public:
  explicit TamperStream(ByteStreamPtr inner) : inner_(std::move(inner)) {}
  std::optional<std::uint64_t> flip_read_at;
  std::uint64_t read_count() const { return read_; }

  awaitable<result<std::size_t>> read_some(MutableBytesView buf) override {
    auto n = co_await inner_->read_some(buf);
    if (!n) co_return n;
    if (flip_read_at && *flip_read_at >= read_ && *flip_read_at < read_ + n.value())
      buf[*flip_read_at - read_] ^= 0x04;
    read_ += n.value();
    co_return n;
  }
  awaitable<result<void>> write(BytesView data) override { return inner_->write(data); }
  awaitable<result<void>> close_write() override { return inner_->close_write(); }
  void reset() override { inner_->reset(); }
  asio::any_io_executor get_executor() override { return inner_->get_executor(); }
  std::string describe() const override { return "tamper " + inner_->describe(); }

 private:
  ByteStreamPtr inner_;
  std::uint64_t read_ = 0;
};

Bytes pattern(std::size_t n, std::uint32_t seed) {
  Bytes b(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& c : b) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<std::uint8_t>(x >> 24);
  }
  return b;
}

awaitable<result<Bytes>> read_n(ByteStream& s, std::size_t n, std::size_t buf_size) {
  Bytes out(n);
  std::size_t got = 0;
  while (got < n) {
    std::size_t want = std::min(buf_size, n - got);
    ST_CO_TRY(auto k, co_await s.read_some(MutableBytesView(out).subspan(got, want)));
    got += k;
  }
  co_return out;
}

// Reads until an error; returns it (data read on the way is dropped).
awaitable<Error> read_until_error(ByteStream& s) {
  Bytes buf(64 * 1024);
  for (;;) {
    auto n = co_await s.read_some(buf);
    if (!n) co_return n.error();
  }
}

using Handshakes = std::tuple<result<SecureChannel>, result<SecureChannel>>;

// Outbound on `a`, inbound on `b`, concurrently.
awaitable<Handshakes> handshake(ByteStreamPtr a, ByteStreamPtr b, const crypto::KeyPair& ia,
                                const crypto::KeyPair& ib, std::optional<PeerId> expected,
                                Duration timeout = 10s) {
  co_return co_await (noise_secure_outbound(a, ia, std::move(expected), timeout) &&
                      noise_secure_inbound(b, ib, timeout));
}

struct Fixture {
  asio::io_context io;
  crypto::KeyPair ka = crypto::KeyPair::generate();
  crypto::KeyPair kb = crypto::KeyPair::generate();
  PeerId pa = PeerId::from_public_key(ka.public_key());
  PeerId pb = PeerId::from_public_key(kb.public_key());
};

NoiseStream& as_noise(const ByteStreamPtr& s) {
  return dynamic_cast<NoiseStream&>(*s);
}

}  // namespace

TEST(NoiseHandshake, BothOrdersOverTcp) {
  Fixture f;
  for (int order = 0; order < 2; ++order) {
    auto [x, y] = test::tcp_pair(f.io);
    ByteStreamPtr out = order == 0 ? ByteStreamPtr(x) : ByteStreamPtr(y);
    ByteStreamPtr in = order == 0 ? ByteStreamPtr(y) : ByteStreamPtr(x);
    test::run_with_deadline(f.io, [&]() -> awaitable<void> {
      auto [ra, rb] = co_await handshake(out, in, f.ka, f.kb, f.pb);
      NOISE_CO_REQUIRE(ra && rb);
      EXPECT_EQ(ra.value().remote_peer, f.pb);
      EXPECT_EQ(ra.value().remote_key, f.kb.public_key());
      EXPECT_EQ(rb.value().remote_peer, f.pa);
      EXPECT_EQ(rb.value().remote_key, f.ka.public_key());
      auto& sa = *ra.value().stream;
      auto& sb = *rb.value().stream;
      NOISE_CO_REQUIRE(co_await sa.write(to_bytes("hello from the dialer")));
      auto got = co_await read_n(sb, 21, 1024);
      NOISE_CO_REQUIRE(got);
      EXPECT_EQ(as_string(got.value()), "hello from the dialer");
      NOISE_CO_REQUIRE(co_await sb.write(to_bytes("and back")));
      auto back = co_await read_n(sa, 8, 1024);
      NOISE_CO_REQUIRE(back);
      EXPECT_EQ(as_string(back.value()), "and back");
    });
    f.io.restart();
  }
}

TEST(NoiseStream, FullDuplexTenMegabytes) {
  Fixture f;
  auto [x, y] = test::tcp_pair(f.io);
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    auto [ra, rb] = co_await handshake(x, y, f.ka, f.kb, std::nullopt);
    NOISE_CO_REQUIRE(ra && rb);
    auto a = ra.value().stream, b = rb.value().stream;
    const std::size_t n = 10 * 1024 * 1024;
    Bytes da = pattern(n, 1), db = pattern(n, 2);
    // One reader and one writer at the same time on each end.
    auto [wa, rb_data, wb, ra_data] =
        co_await (a->write(da) && read_n(*b, n, 100000) && b->write(db) && read_n(*a, n, 7777));
    EXPECT_TRUE(wa);
    EXPECT_TRUE(wb);
    NOISE_CO_REQUIRE(rb_data && ra_data);
    EXPECT_TRUE(rb_data.value() == da);
    EXPECT_TRUE(ra_data.value() == db);
  });
}

TEST(NoiseStream, WritesAtFrameBoundaries) {
  Fixture f;
  auto [x, y] = test::tcp_pair(f.io);
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    auto [ra, rb] = co_await handshake(x, y, f.ka, f.kb, std::nullopt);
    NOISE_CO_REQUIRE(ra && rb);
    auto a = ra.value().stream, b = rb.value().stream;
    std::uint32_t seed = 10;
    for (std::size_t size : {std::size_t{1}, std::size_t{65519}, std::size_t{65520},
                             std::size_t{1} << 20, std::size_t{3 * 65519 + 1}, std::size_t{0}}) {
      for (std::size_t read_buf : {std::size_t{7}, std::size_t{65519}, std::size_t{1} << 21}) {
        Bytes data = pattern(size, ++seed);
        auto before = as_noise(a).frames_sent();
        auto [w, got] = co_await (a->write(data) && read_n(*b, size, read_buf));
        NOISE_CO_REQUIRE(w && got);
        EXPECT_TRUE(got.value() == data) << size << " bytes read " << read_buf << " at a time";
        EXPECT_EQ(as_noise(a).frames_sent() - before, (size + 65518) / 65519) << size;
      }
    }
    EXPECT_EQ(as_noise(a).frames_sent(), as_noise(b).frames_received());
    // Half-close: the reader sees the end of the stream after the last byte.
    NOISE_CO_REQUIRE(co_await a->write(to_bytes("last")));
    NOISE_CO_REQUIRE(co_await a->close_write());
    auto last = co_await read_n(*b, 4, 100);
    NOISE_CO_REQUIRE(last);
    Bytes buf(10);
    auto end = co_await b->read_some(buf);
    NOISE_CO_REQUIRE(!end);
    EXPECT_EQ(end.error(), errc::closed);
    EXPECT_FALSE(co_await a->write(to_bytes("x"))) << "write after close_write";
    NOISE_CO_REQUIRE(co_await b->write(to_bytes("still open")));
    auto other = co_await read_n(*a, 10, 100);
    NOISE_CO_REQUIRE(other);
    EXPECT_EQ(as_string(other.value()), "still open");
  });
}

TEST(NoiseHandshake, WrongExpectedPeerFailsOnBothSides) {
  Fixture f;
  auto [x, y] = test::tcp_pair(f.io);
  auto stranger = PeerId::from_public_key(crypto::KeyPair::generate().public_key());
  auto t0 = Clock::now();
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    auto [ra, rb] = co_await handshake(x, y, f.ka, f.kb, stranger);
    NOISE_CO_REQUIRE(!ra && !rb);
    EXPECT_EQ(ra.error(), errc::protocol_violation);
    EXPECT_NE(ra.error().context().find(stranger.to_string()), std::string::npos)
        << ra.error().message();
    EXPECT_NE(ra.error().context().find(f.pb.to_string()), std::string::npos)
        << ra.error().message();
  });
  EXPECT_LT(Clock::now() - t0, 5s) << "the responder must not wait for its timeout";
}

TEST(NoiseHandshake, TamperedHandshakeBytesFail) {
  // Offsets in what one side reads: the initiator reads message 2 at [0, 2 + len2); the
  // responder reads message 1 at [0, 34) and message 3 right after it.
  struct Case {
    bool tamper_initiator_reads;
    std::uint64_t offset;
  };
  for (Case c : {Case{true, 2 + 10}, Case{true, 2 + 40}, Case{true, 2 + 120}, Case{false, 2 + 5},
                 Case{false, 34 + 2 + 20}, Case{false, 34 + 2 + 70}}) {
    Fixture f;
    auto [x, y] = test::tcp_pair(f.io);
    auto tx = std::make_shared<TamperStream>(x);
    auto ty = std::make_shared<TamperStream>(y);
    (c.tamper_initiator_reads ? tx : ty)->flip_read_at = c.offset;
    test::run_with_deadline(
        f.io,
        [&]() -> awaitable<void> {
          auto [ra, rb] = co_await handshake(tx, ty, f.ka, f.kb, std::nullopt, 5s);
          if (ra && rb) {
            ADD_FAILURE() << "tampering at " << c.offset << " went unnoticed";
            co_return;
          }
          // Whoever reads the flipped byte reports a protocol violation.
          if (c.tamper_initiator_reads || c.offset < 34) {
            NOISE_CO_REQUIRE(!ra);
            EXPECT_EQ(ra.error(), errc::protocol_violation) << ra.error().message();
          } else {
            // Message 3 is the initiator's last: it may finish, but its stream is then dead.
            NOISE_CO_REQUIRE(!rb);
            EXPECT_EQ(rb.error(), errc::protocol_violation) << rb.error().message();
            if (ra) {
              auto e = co_await read_until_error(*ra.value().stream);
              EXPECT_NE(e, errc::ok);
            }
          }
        },
        15s);
  }
}

TEST(NoiseStream, TamperedTransportFrameResetsInsteadOfDelivering) {
  Fixture f;
  auto [x, y] = test::tcp_pair(f.io);
  auto ty = std::make_shared<TamperStream>(y);
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    auto [ra, rb] = co_await handshake(x, ty, f.ka, f.kb, std::nullopt);
    NOISE_CO_REQUIRE(ra && rb);
    auto a = ra.value().stream, b = rb.value().stream;
    NOISE_CO_REQUIRE(co_await a->write(to_bytes("first frame is fine")));
    auto ok = co_await read_n(*b, 19, 100);
    NOISE_CO_REQUIRE(ok);
    ty->flip_read_at = ty->read_count() + 2 + 3;
    NOISE_CO_REQUIRE(co_await a->write(to_bytes("second frame gets a flipped bit")));
    Bytes buf(100);
    auto bad = co_await b->read_some(buf);
    NOISE_CO_REQUIRE(!bad);
    EXPECT_EQ(bad.error(), errc::protocol_violation) << bad.error().message();
    auto again = co_await b->read_some(buf);
    NOISE_CO_REQUIRE(!again);
    EXPECT_EQ(again.error(), errc::protocol_violation);
    // b reset the connection: a's reads end with an error, not with data.
    auto e = co_await read_until_error(*a);
    EXPECT_TRUE(e == errc::reset || e == errc::closed) << e.message();
  });
}

TEST(NoiseStream, BadFramingFromThePeer) {
  // A NoiseStream over one end, raw bytes from the other.
  auto id_a = crypto::KeyPair::generate(), id_b = crypto::KeyPair::generate();
  for (int variant = 0; variant < 3; ++variant) {
    asio::io_context io;
    auto [x, y] = test::tcp_pair(io);
    noise::Libp2pHandshake hi(noise::Role::initiator, id_a), hr(noise::Role::responder, id_b);
    ASSERT_TRUE(hr.read_message(hi.write_message().value()));
    ASSERT_TRUE(hi.read_message(hr.write_message().value()));
    ASSERT_TRUE(hr.read_message(hi.write_message().value()));
    auto tx = hi.split().value();
    auto s = std::make_shared<NoiseStream>(x, tx, "noise test");
    test::run_with_deadline(io, [&]() -> awaitable<void> {
      Bytes raw;
      if (variant == 0) raw = {0x00, 0x05, 1, 2, 3, 4, 5};       // shorter than the tag
      if (variant == 1) raw = {0x00, 0x40, 1, 2, 3};             // truncated, then closed
      if (variant == 2) raw = Bytes(2 + 40, 0x00), raw[1] = 40;  // garbage ciphertext
      NOISE_CO_REQUIRE(co_await y->write(raw));
      NOISE_CO_REQUIRE(co_await y->close_write());
      Bytes buf(100);
      auto r = co_await s->read_some(buf);
      NOISE_CO_REQUIRE(!r);
      EXPECT_EQ(r.error(), errc::protocol_violation) << r.error().message();
    });
  }
}

TEST(NoiseHandshake, PeerClosingMidHandshakeFailsFast) {
  for (int variant = 0; variant < 3; ++variant) {
    Fixture f;
    auto [x, y] = test::tcp_pair(f.io);
    auto t0 = Clock::now();
    test::run_with_deadline(f.io, [&]() -> awaitable<void> {
      auto peer = [&]() -> awaitable<result<void>> {
        Bytes m1(34);
        ST_CO_TRY(co_await read_exact(*y, m1));
        if (variant == 1) {  // half a message 2, then FIN
          Bytes partial{0x00, 0x60, 1, 2, 3, 4, 5, 6, 7, 8};
          ST_CO_TRY(co_await y->write(partial));
        }
        if (variant == 2) {
          y->reset();
          co_return success();
        }
        co_return co_await y->close_write();
      };
      auto [ra, rp] = co_await (noise_secure_outbound(x, f.ka, f.pb, 10s) && peer());
      EXPECT_TRUE(rp);
      NOISE_CO_REQUIRE(!ra);
      if (variant == 1)
        EXPECT_EQ(ra.error(), errc::protocol_violation) << ra.error().message();
      else
        EXPECT_TRUE(ra.error() == errc::closed || ra.error() == errc::reset)
            << ra.error().message();
    });
    EXPECT_LT(Clock::now() - t0, 5s) << "variant " << variant;
  }
}

TEST(NoiseHandshake, SilentPeerTimesOutAndGetsReset) {
  for (bool outbound : {true, false}) {
    Fixture f;
    auto [x, y] = test::tcp_pair(f.io);
    auto t0 = Clock::now();
    test::run_with_deadline(f.io, [&]() -> awaitable<void> {
      result<SecureChannel> r = make_error(errc::internal);
      // (Not `cond ? co_await a : co_await b`: GCC 12 mishandles temporaries there.)
      if (outbound)
        r = co_await noise_secure_outbound(x, f.ka, std::nullopt, 200ms);
      else
        r = co_await noise_secure_inbound(x, f.ka, 200ms);
      NOISE_CO_REQUIRE(!r);
      EXPECT_EQ(r.error(), errc::timeout) << r.error().message();
      EXPECT_NE(r.error().context().find("noise handshake"), std::string::npos);
      // The silent peer sees the connection end (after message 1 if we were the dialer).
      auto e = co_await read_until_error(*y);
      EXPECT_TRUE(e == errc::reset || e == errc::closed) << e.message();
    });
    EXPECT_LT(Clock::now() - t0, 5s);
  }
}

TEST(NoiseStream, Throughput) {
  // Prints MB/s for one direction over loopback TCP, Noise versus raw, on one io_context
  // thread (so encryption and decryption share a core). STARLING_NOISE_BENCH_MB overrides.
  std::size_t mb = 256;
  if (const char* env = std::getenv("STARLING_NOISE_BENCH_MB")) mb = std::strtoul(env, nullptr, 10);
  const std::size_t total = mb << 20, chunk = 1 << 20;
  Bytes src = pattern(chunk, 99);
  auto pump = [&](ByteStreamPtr w, ByteStreamPtr r) -> awaitable<void> {
    auto writer = [&]() -> awaitable<result<void>> {
      for (std::size_t sent = 0; sent < total; sent += chunk) ST_CO_TRY(co_await w->write(src));
      co_return success();
    };
    auto reader = [&]() -> awaitable<result<std::size_t>> {
      Bytes buf(chunk);
      std::size_t got = 0;
      while (got < total) {
        ST_CO_TRY(auto n, co_await r->read_some(buf));
        got += n;
      }
      co_return got;
    };
    auto [wr, rd] = co_await (writer() && reader());
    EXPECT_TRUE(wr);
    EXPECT_TRUE(rd && rd.value() == total);
  };
  double secs[2];
  for (int noise_on = 0; noise_on < 2; ++noise_on) {
    Fixture f;
    auto [x, y] = test::tcp_pair(f.io);
    test::run_with_deadline(
        f.io,
        [&]() -> awaitable<void> {
          ByteStreamPtr a = x, b = y;
          if (noise_on) {
            auto [ra, rb] = co_await handshake(x, y, f.ka, f.kb, std::nullopt);
            NOISE_CO_REQUIRE(ra && rb);
            a = ra.value().stream;
            b = rb.value().stream;
          }
          auto t0 = Clock::now();
          co_await pump(a, b);
          secs[noise_on] = std::chrono::duration<double>(Clock::now() - t0).count();
        },
        300s);
  }
  double raw_mbs = static_cast<double>(mb) / secs[0], noise_mbs = static_cast<double>(mb) / secs[1];
  std::printf("[noise throughput] %zu MiB: raw TCP %.0f MiB/s, noise %.0f MiB/s (%.0f%%)\n", mb,
              raw_mbs, noise_mbs, 100.0 * noise_mbs / raw_mbs);
  RecordProperty("noise_mib_per_s", static_cast<int>(noise_mbs));
  RecordProperty("raw_mib_per_s", static_cast<int>(raw_mbs));
}
