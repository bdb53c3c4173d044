// Multiaddrs: spec vector, text/binary round trips, helpers, and every rejection path.
#include <gtest/gtest.h>

#include "starling/net/multiaddr.hpp"

using namespace starling;
using namespace starling::net;

namespace {

constexpr const char* kEdPeer = "12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3pq";
constexpr const char* kShaPeer = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N";

void expect_text_reject(std::string_view text, errc code, const char* needle = nullptr) {
  auto r = Multiaddr::parse(text);
  ASSERT_FALSE(r) << "accepted: " << text;
  EXPECT_EQ(r.error(), code) << text << ": " << r.error().message();
  if (needle) {
    EXPECT_NE(r.error().message().find(needle), std::string::npos)
        << text << ": " << r.error().message();
  }
}

void expect_bytes_reject(std::string_view hex, errc code, const char* needle = nullptr) {
  auto r = Multiaddr::from_bytes(from_hex(hex).value());
  ASSERT_FALSE(r) << "accepted: " << hex;
  EXPECT_EQ(r.error(), code) << hex << ": " << r.error().message();
  if (needle) {
    EXPECT_NE(r.error().message().find(needle), std::string::npos)
        << hex << ": " << r.error().message();
  }
}

}  // namespace

TEST(Multiaddr, SpecVector) {
  // multiformats/multiaddr test/multiaddr.feature: "Simple string form" / "Simple packed form".
  auto ma = Multiaddr::parse("/ip4/192.0.2.42/tcp/443");
  ASSERT_TRUE(ma) << ma.error().message();
  EXPECT_EQ(to_hex(ma.value().to_bytes()), "04c000022a0601bb");
  auto back = Multiaddr::from_bytes(from_hex("04c000022a0601bb").value());
  ASSERT_TRUE(back);
  EXPECT_EQ(back.value().to_string(), "/ip4/192.0.2.42/tcp/443");
  ASSERT_EQ(back.value().components().size(), 2u);
  EXPECT_EQ(back.value().components()[0].proto, Proto::ip4);
  EXPECT_EQ(to_hex(back.value().components()[0].value), "c000022a");
  EXPECT_EQ(back.value().components()[1].proto, Proto::tcp);
  EXPECT_EQ(to_hex(back.value().components()[1].value), "01bb");
}

TEST(Multiaddr, RoundTrips) {
  // Binary forms computed independently (Python: ipaddress.packed, LEB128, big-int base58)
  // from the codes in multiformats/multiaddr protocols.csv.
  const std::pair<std::string, std::string> cases[] = {
      {"/ip6/2001:db8::1/udp/4001/quic-v1", "2920010db800000000000000000000000191020fa1cd03"},
      {"/dns4/example.com/tcp/443/wss", "360b6578616d706c652e636f6d0601bbde03"},
      {"/dnsaddr/bootstrap.libp2p.io/p2p/QmNnooDu7bfjPFoTZYxMNLWUQJyrVwtbZg5gBMjTezGAJN",
       "3813626f6f7473747261702e6c69627032702e696fa50322122006b3608aa000274049eb28ad8e793a26ff6fa"
       "b281a7d3bd77cd18eb745dfaabb"},
      {std::string("/ip4/1.2.3.4/tcp/4001/p2p/") + kEdPeer + "/p2p-circuit/p2p/" + kShaPeer,
       "0401020304060fa1a503260024080112201ed1e8fae2c4a144b8be8fd4b47bf3d3b34b871c3cacf6010f0e42d"
       "474fce27ea202a5032212209dff3b17d74cf4d38a50d8b6383e92d181a10395a5e73a726dcccbd21bf6f0b9"},
      {"/ip6/::1/tcp/0/ws", "2900000000000000000000000000000001060000dd03"},
  };
  for (const auto& [text, hex] : cases) {
    auto ma = Multiaddr::parse(text);
    ASSERT_TRUE(ma) << text << ": " << ma.error().message();
    EXPECT_EQ(ma.value().to_string(), text);
    EXPECT_EQ(to_hex(ma.value().to_bytes()), hex) << text;
    auto back = Multiaddr::from_bytes(from_hex(hex).value());
    ASSERT_TRUE(back) << text << ": " << back.error().message();
    EXPECT_EQ(back.value(), ma.value());
  }
  for (const char* text : {"/dns/localhost/udp/53", "/dns6/h\xc3\xa9llo.example/tcp/1",
                           "/ip4/0.0.0.0/tcp/65535", "/p2p-circuit", "/ip4/1.1.1.1/udp/1/quic"}) {
    auto ma = Multiaddr::parse(text);
    ASSERT_TRUE(ma) << text << ": " << ma.error().message();
    EXPECT_EQ(ma.value().to_string(), text);
    EXPECT_EQ(Multiaddr::from_bytes(ma.value().to_bytes()).value(), ma.value());
  }
}

TEST(Multiaddr, CanonicalisesOnInput) {
  auto ipfs = Multiaddr::parse(std::string("/ip4/1.2.3.4/tcp/1/ipfs/") + kEdPeer);
  ASSERT_TRUE(ipfs) << ipfs.error().message();
  EXPECT_EQ(ipfs.value().to_string(), std::string("/ip4/1.2.3.4/tcp/1/p2p/") + kEdPeer);
  EXPECT_EQ(Multiaddr::parse("/ip4/1.2.3.4/tcp/80/").value().to_string(), "/ip4/1.2.3.4/tcp/80");
  EXPECT_EQ(Multiaddr::parse("/ip6/2001:DB8:0:0::1/tcp/0080").value().to_string(),
            "/ip6/2001:db8::1/tcp/80");
  // A CIDv1 peer id is accepted and printed as base58btc.
  auto cid = Multiaddr::parse("/p2p/bafzbeie5745rpv2m6tjyuugywy4d5ewrqgqqhfnf445he3omzpjbx5xqxe");
  ASSERT_TRUE(cid) << cid.error().message();
  EXPECT_EQ(cid.value().to_string(), std::string("/p2p/") + kShaPeer);
}

TEST(Multiaddr, TextRejections) {
  const auto inval = errc::invalid_argument;
  expect_text_reject("", inval, "empty");
  expect_text_reject("/", inval, "no components");
  expect_text_reject("ip4/1.2.3.4", inval, "start with '/'");
  expect_text_reject("/ip4", inval, "missing value");
  expect_text_reject("/ip4/1.2.3.4/tcp", inval, "missing value");
  expect_text_reject("/ip4/1.2.3.4/tcp/", inval, "missing value");
  expect_text_reject("/foo/1", inval, "unknown protocol 'foo'");
  expect_text_reject("/ip4/1.2.3.4/tcp/80/bogus", inval, "unknown protocol");
  expect_text_reject("/ip4/1.2.3.4/tcp/80/garbage/more", inval, "unknown protocol");
  expect_text_reject("/ip4/1.2.3.4//tcp/80", inval, "empty component");
  expect_text_reject("/ip4/1.2.3.4/tcp/80//", inval, "empty component");
  for (const char* ip :
       {"1.2.3", "1.2.3.4.5", "256.1.1.1", "1.2.3.04", "a.b.c.d", "-1.2.3.4", " 1.2.3.4", "::1"}) {
    expect_text_reject(std::string("/ip4/") + ip, inval, "IPv4");
  }
  expect_text_reject(std::string("/ip4/1.2.3.4\0/tcp/1", 19), inval, "IPv4");
  for (const char* ip : {"1.2.3.4", "fe80::1%eth0", "1:2:3:4:5:6:7:8:9", "gg::1", ":::"}) {
    expect_text_reject(std::string("/ip6/") + ip, inval, "IPv6");
  }
  for (const char* port : {"65536", "99999", "-1", "+80", "8o", "123456", "0x10", " 80"}) {
    expect_text_reject(std::string("/ip4/1.2.3.4/tcp/") + port, inval, "port");
  }
  expect_text_reject("/udp/100000", inval, "udp port");
  expect_text_reject(std::string("/dns4/a\x01") + "b/tcp/1", inval, "DNS");
  expect_text_reject("/dns4/\xc3/tcp/1", inval, "UTF-8");
  expect_text_reject("/dns/" + std::string(256, 'a'), inval, "too long");
  expect_text_reject("/p2p/notapeerid", inval, "peer id");
  expect_text_reject("/p2p/12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3p0", inval, "base58");
  expect_text_reject("/" + std::string(kMaxMultiaddrTextSize, 'a'), errc::too_large);
  // Within the text limit but over the binary limit: 600 x /p2p-circuit is 1200 bytes.
  std::string many;
  for (int i = 0; i < 600; ++i) many += "/p2p-circuit";
  expect_text_reject(many, errc::too_large);
  // The longest binary form that is accepted also prints and parses back.
  Bytes circuits;
  for (std::size_t i = 0; i < kMaxMultiaddrSize / 2; ++i) append_uvarint(circuits, 0x0122);
  auto big = Multiaddr::from_bytes(circuits);
  ASSERT_TRUE(big);
  EXPECT_EQ(Multiaddr::parse(big.value().to_string()).value(), big.value());
}

TEST(Multiaddr, BinaryRejections) {
  const auto inval = errc::invalid_argument;
  expect_bytes_reject("", inval, "empty");
  expect_bytes_reject("04c00002", inval, "truncated");               // ip4 needs 4 bytes
  expect_bytes_reject("04c000022a06", inval, "truncated");           // tcp port missing
  expect_bytes_reject("04c000022a0601", inval, "truncated");         // tcp port half present
  expect_bytes_reject("29000000", inval, "truncated");               // ip6 needs 16 bytes
  expect_bytes_reject("ff", inval, "truncated protocol code");       // varint continues
  expect_bytes_reject("8000", inval, "non-minimal");                 // non-minimal varint code
  expect_bytes_reject("21", inval, "unknown protocol code 0x21");    // dccp: not supported
  expect_bytes_reject("1100", inval, "unknown protocol code 0x11");  // old udp code
  expect_bytes_reject("360b6578616d706c65", inval, "truncated");     // dns4 length 11, 7 present
  expect_bytes_reject("3600", inval, "empty DNS name");
  expect_bytes_reject("36032f6162", inval, "DNS");                // '/' inside a DNS name
  expect_bytes_reject("3602c328", inval, "UTF-8");                // invalid UTF-8
  expect_bytes_reject("a50300", inval, "peer id");                // empty multihash
  expect_bytes_reject("a503021300", inval, "multihash code");     // sha1-ish code 0x13
  expect_bytes_reject("a50303122001", inval, "length");           // sha256 length mismatch
  expect_bytes_reject("04c000022a0601bbff", inval, "truncated");  // trailing garbage
  expect_bytes_reject("04c000022a0601bb00", inval, "unknown protocol code 0x0");
  expect_bytes_reject(std::string(2100, 'd').insert(0, "dd03"), errc::too_large);
}

TEST(Multiaddr, TcpEndpointHelpers) {
  asio::ip::tcp::endpoint v4(asio::ip::make_address("10.0.0.7"), 4001);
  auto ma = Multiaddr::from_tcp_endpoint(v4);
  EXPECT_EQ(ma.to_string(), "/ip4/10.0.0.7/tcp/4001");
  EXPECT_EQ(ma.to_tcp_endpoint().value(), v4);

  asio::ip::tcp::endpoint v6(asio::ip::make_address("2001:db8::5"), 443);
  auto ma6 = Multiaddr::from_tcp_endpoint(v6);
  EXPECT_EQ(ma6.to_string(), "/ip6/2001:db8::5/tcp/443");
  EXPECT_EQ(ma6.to_tcp_endpoint().value(), v6);

  asio::ip::tcp::endpoint mapped(asio::ip::make_address("::ffff:192.0.2.1"), 7);
  EXPECT_EQ(Multiaddr::from_tcp_endpoint(mapped).to_string(), "/ip4/192.0.2.1/tcp/7");

  auto id = PeerId::from_string(kEdPeer).value();
  auto with = ma.with_peer_id(id);
  EXPECT_EQ(with.to_string(), std::string("/ip4/10.0.0.7/tcp/4001/p2p/") + kEdPeer);
  EXPECT_EQ(with.to_tcp_endpoint().value(), v4);
  EXPECT_EQ(with.peer_id().value(), id);
  EXPECT_FALSE(ma.peer_id().has_value());
  EXPECT_EQ(with.without_peer_id(), ma);
  EXPECT_EQ(ma.without_peer_id(), ma);
  // with_peer_id replaces an existing trailing /p2p.
  auto other = PeerId::from_string(kShaPeer).value();
  EXPECT_EQ(with.with_peer_id(other).to_string(),
            std::string("/ip4/10.0.0.7/tcp/4001/p2p/") + kShaPeer);
  EXPECT_EQ(with.with_peer_id(PeerId()), ma);

  for (const char* text : {"/ip4/1.2.3.4/udp/1", "/dns4/example.com/tcp/1", "/ip4/1.2.3.4",
                           "/ip4/1.2.3.4/tcp/1/ws", "/tcp/1/ip4/1.2.3.4", "/p2p-circuit"}) {
    auto r = Multiaddr::parse(text).value().to_tcp_endpoint();
    ASSERT_FALSE(r) << text;
    EXPECT_EQ(r.error(), errc::unsupported) << text;
  }
  EXPECT_FALSE(Multiaddr().to_tcp_endpoint());
}

TEST(Multiaddr, DnsTcp) {
  auto d = Multiaddr::parse(std::string("/dns4/boot.example.org/tcp/4001/p2p/") + kEdPeer)
               .value()
               .dns_tcp();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->first, "boot.example.org");
  EXPECT_EQ(d->second, 4001);
  EXPECT_EQ(Multiaddr::parse("/dns/h/tcp/1").value().dns_tcp()->first, "h");
  EXPECT_EQ(Multiaddr::parse("/dns6/h/tcp/2").value().dns_tcp()->second, 2);
  EXPECT_FALSE(Multiaddr::parse("/dnsaddr/h").value().dns_tcp().has_value());
  EXPECT_FALSE(Multiaddr::parse("/dns4/h/udp/1").value().dns_tcp().has_value());
  EXPECT_FALSE(Multiaddr::parse("/ip4/1.2.3.4/tcp/1").value().dns_tcp().has_value());
  EXPECT_FALSE(Multiaddr::parse("/dns4/h/tcp/1/ws").value().dns_tcp().has_value());
}

TEST(Multiaddr, ProtoNames) {
  EXPECT_EQ(proto_name(Proto::p2p_circuit), "p2p-circuit");
  EXPECT_EQ(proto_name(Proto::quic_v1), "quic-v1");
  EXPECT_EQ(static_cast<std::uint32_t>(Proto::quic_v1), 461u);  // protocols.csv
  EXPECT_EQ(static_cast<std::uint32_t>(Proto::udp), 273u);
}
