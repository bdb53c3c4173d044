// PCP (pcp.hpp, portmap_pcp.cpp): the message layout against RFC 6887's, the parser's
// rejections, and the backend against a scripted PCP server on a loopback UDP socket: MAP
// granted with the server's port and lifetime, answers for other nonces ignored, a lost answer
// retransmitted, the removal sent with the mapping's nonce, a NAT-PMP-only gateway reported
// unavailable so the NAT-PMP backend takes over, a refusal reported with its result code.
#include <gtest/gtest.h>

#include <functional>

#include <asio/detached.hpp>
#include <asio/ip/udp.hpp>

#include "starling/net/pcp.hpp"
#include "starling/net/portmap.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

namespace {

const auto kLocal = asio::ip::address_v4::loopback();

Bytes answer_to(BytesView req, std::uint8_t result, std::uint32_t lifetime, std::uint16_t ext_port,
                const asio::ip::address_v4& ext) {
  Bytes out(pcp::kHeaderSize + (req[1] == pcp::kOpMap ? pcp::kMapSize : 0), 0);
  out[0] = 2;
  out[1] = req[1] | 0x80;
  out[3] = result;
  out[4] = lifetime >> 24, out[5] = lifetime >> 16, out[6] = lifetime >> 8, out[7] = lifetime;
  out[11] = 77;  // epoch 77
  if (req[1] == pcp::kOpMap) {
    std::copy(req.begin() + 24, req.begin() + 44, out.begin() + 24);  // nonce, proto, int. port
    out[42] = ext_port >> 8, out[43] = ext_port & 0xff;
    out[54] = out[55] = 0xff;
    auto b = ext.to_bytes();
    std::copy(b.begin(), b.end(), out.begin() + 56);
  }
  return out;
}

// A PCP server on 127.0.0.1:<port 0>: `script` answers each request (empty: no answer).
struct FakeServer {
  asio::ip::udp::socket sock;
  std::vector<Bytes> requests;
  std::function<std::vector<Bytes>(BytesView)> script;
  explicit FakeServer(asio::io_context& io)
      : sock(io, asio::ip::udp::endpoint(asio::ip::address_v4::loopback(), 0)) {}
  asio::ip::udp::endpoint endpoint() const { return sock.local_endpoint(); }
  awaitable<void> serve() {
    std::array<std::uint8_t, 1200> buf;
    for (;;) {
      asio::ip::udp::endpoint from;
      auto [ec, n] = co_await sock.async_receive_from(asio::buffer(buf), from, use_nothrow);
      if (ec) co_return;
      requests.emplace_back(buf.begin(), buf.begin() + n);
      for (auto& a : script(requests.back()))
        (void)co_await sock.async_send_to(asio::buffer(a), from, use_nothrow);
    }
  }
};

}  // namespace

TEST(PcpWire, MapRequestLayout) {
  pcp::MapRequest r;
  r.client = asio::ip::address_v4({192, 168, 1, 5});
  for (int i = 0; i < 12; ++i) r.nonce[i] = static_cast<std::uint8_t>(i + 1);
  r.internal_port = 4001;
  r.suggested_external_port = 4001;
  r.lifetime = 7200;
  const Bytes b = pcp::encode_map(r);
  ASSERT_EQ(b.size(), 60u);
  EXPECT_EQ(to_hex(BytesView(b).subspan(0, 24)),
            "02010000"
            "00001c20"
            "00000000000000000000ffffc0a80105");
  EXPECT_EQ(to_hex(BytesView(b).subspan(24, 36)),
            "0102030405060708090a0b0c"
            "06000000"
            "0fa1"
            "0fa1"
            "00000000000000000000ffff00000000");
  EXPECT_EQ(pcp::encode_announce(r.client).size(), 24u);
  EXPECT_EQ(pcp::encode_announce(r.client)[1], pcp::kOpAnnounce);
}

TEST(PcpWire, ParsesAnswersAndRejectsMalformedOnes) {
  pcp::MapRequest r;
  r.client = kLocal;
  r.nonce.fill(7);
  r.internal_port = 4001;
  r.lifetime = 60;
  const Bytes req = pcp::encode_map(r);
  const Bytes ok = answer_to(req, 0, 60, 5001, asio::ip::address_v4({11, 77, 2, 2}));
  auto a = pcp::parse_response(ok);
  ASSERT_TRUE(a) << a.error().message();
  EXPECT_EQ(a.value().opcode, pcp::kOpMap);
  EXPECT_EQ(a.value().lifetime, 60u);
  EXPECT_EQ(a.value().epoch, 77u);
  EXPECT_EQ(a.value().nonce, r.nonce);
  EXPECT_EQ(a.value().internal_port, 4001);
  EXPECT_EQ(a.value().external_port, 5001);
  EXPECT_EQ(a.value().external_ip.to_string(), "11.77.2.2");
  // Options after the fields are skipped.
  Bytes with_option = ok;
  with_option.insert(with_option.end(), {0x12, 0, 0, 0});
  EXPECT_TRUE(pcp::parse_response(with_option));

  EXPECT_EQ(pcp::parse_response(Bytes{0, 0x80, 0, 1, 0, 0, 0, 5}).error().code(),
            errc::unsupported);
  auto bad = [](Bytes b) { return pcp::parse_response(b).error().code(); };
  EXPECT_EQ(bad(Bytes(ok.begin(), ok.begin() + 20)), errc::protocol_violation);  // short
  EXPECT_EQ(bad(Bytes(ok.begin(), ok.begin() + 58)), errc::protocol_violation);  // not 4k
  EXPECT_EQ(bad(Bytes(ok.begin(), ok.begin() + 24)), errc::protocol_violation);  // no fields
  EXPECT_EQ(bad(Bytes(1104, 0x02)), errc::protocol_violation);                   // too long
  Bytes request_bit = ok;
  request_bit[1] = pcp::kOpMap;
  EXPECT_EQ(bad(request_bit), errc::protocol_violation);
  Bytes version = ok;
  version[0] = 3;
  EXPECT_EQ(bad(version), errc::protocol_violation);
  Bytes opcode = ok;
  opcode[1] = 0x80 | 2;  // PEER: never asked for
  EXPECT_EQ(bad(opcode), errc::protocol_violation);
  Bytes v6 = ok;
  v6[44] = 0x20;  // a success with an IPv6 external address
  EXPECT_EQ(bad(v6), errc::protocol_violation);
  EXPECT_EQ(pcp::result_name(2), "NOT_AUTHORIZED (2)");
  EXPECT_EQ(pcp::result_name(99), "result code 99");
}

TEST(PcpBackend, MapsIgnoresOtherNoncesRetransmitsAndRemovesWithTheNonce) {
  asio::io_context io;
  FakeServer server(io);
  int maps = 0;
  server.script = [&](BytesView req) -> std::vector<Bytes> {
    if (req[1] == pcp::kOpAnnounce) return {answer_to(req, 0, 0, 0, {})};
    if (++maps == 1) return {};  // the first MAP is lost: the client must send it again
    Bytes other = answer_to(req, 0, 30, 6000, asio::ip::address_v4({11, 77, 2, 2}));
    other[24] ^= 1;  // another client's nonce
    const std::uint32_t lifetime =
        req[7] == 0 && req[6] == 0 && req[5] == 0 && req[4] == 0 ? 0 : 30;
    return {other, answer_to(req, 0, lifetime, 5001, asio::ip::address_v4({11, 77, 2, 2}))};
  };
  asio::co_spawn(io, server.serve(), asio::detached);
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    auto b = make_pcp_backend(io.get_executor(), server.endpoint());
    auto ext = co_await b->discover(2s);
    CO_ASSERT_OK(ext);
    EXPECT_TRUE(ext.value().is_unspecified());  // told with the first mapping
    EXPECT_EQ(b->epoch()->seconds, 77u);
    const auto t0 = Clock::now();
    auto m = co_await b->map(4001, 3600s, 10s);
    CO_ASSERT_OK(m);
    EXPECT_GE(Clock::now() - t0, 2500ms);  // waited for the retransmission (3 s +- 10%)
    EXPECT_EQ(m.value().external_port, 5001);
    EXPECT_EQ(m.value().external_ip.to_string(), "11.77.2.2");
    EXPECT_EQ(m.value().lifetime, 30s);
    // Request layout as the server saw it: the client field is the source address.
    const Bytes& first_map = server.requests.at(1);
    EXPECT_EQ(to_hex(BytesView(first_map).subspan(8, 16)), "00000000000000000000ffff7f000001");
    EXPECT_EQ(server.requests.at(2), first_map);  // the retransmission is the same message
    // A renewal keeps the nonce; the removal too, with lifetime 0.
    CO_ASSERT_OK(co_await b->map(4001, 3600s, 10s));
    CO_ASSERT_OK(co_await b->unmap(m.value(), 10s));
    const Bytes& del = server.requests.back();
    EXPECT_EQ(to_hex(BytesView(del).subspan(4, 4)), "00000000");
    EXPECT_TRUE(std::equal(del.begin() + 24, del.begin() + 36, first_map.begin() + 24));
    server.sock.close();
  });
}

TEST(PcpBackend, NatPmpOnlyGatewayIsUnavailableAndARefusalNamesItsCode) {
  asio::io_context io;
  FakeServer server(io);
  bool natpmp_only = true;
  server.script = [&](BytesView req) -> std::vector<Bytes> {
    if (natpmp_only) return {Bytes{0, 0x80, 0, 1, 0, 0, 0, 9}};  // NAT-PMP: unsupported version
    return {answer_to(req, req[1] == pcp::kOpMap ? 2 : 0, 0, 0, {})};
  };
  asio::co_spawn(io, server.serve(), asio::detached);
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    auto b = make_pcp_backend(io.get_executor(), server.endpoint());
    const auto t0 = Clock::now();
    auto ext = co_await b->discover(2s);
    CO_ASSERT_FALSE(ext);
    EXPECT_EQ(ext.error().code(), errc::unavailable);
    EXPECT_LT(Clock::now() - t0, 1s);  // at once, not at the deadline
    natpmp_only = false;
    CO_ASSERT_OK(co_await b->discover(2s));
    auto m = co_await b->map(4001, 60s, 2s);
    CO_ASSERT_FALSE(m);
    EXPECT_EQ(m.error().code(), errc::unsupported);
    EXPECT_NE(m.error().message().find("NOT_AUTHORIZED"), std::string::npos) << m.error().message();
    server.sock.close();
  });
}

TEST(PcpBackend, SilentGatewayTimesOutAtTheDeadline) {
  asio::io_context io;
  FakeServer server(io);
  server.script = [](BytesView) { return std::vector<Bytes>{}; };
  asio::co_spawn(io, server.serve(), asio::detached);
  test::run_with_deadline(io, [&]() -> awaitable<void> {
    auto b = make_pcp_backend(io.get_executor(), server.endpoint());
    const auto t0 = Clock::now();
    auto ext = co_await b->discover(500ms);
    CO_ASSERT_FALSE(ext);
    EXPECT_EQ(ext.error().code(), errc::timeout);
    EXPECT_LT(Clock::now() - t0, 2s);
    server.sock.close();
  });
}
