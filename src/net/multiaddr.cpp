// Multiaddr text/binary codecs and the TCP/DNS/peer-id helpers.
#include "starling/net/multiaddr.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <string>

#include <fmt/format.h>

#include "starling/core/base58.hpp"

namespace starling::net {
namespace {

enum class Kind { ip4, ip6, port, dns, p2p, none };

struct ProtoInfo {
  Proto code;
  std::string_view name;
  Kind kind;
};

constexpr std::array<ProtoInfo, 14> kProtos{{
    {Proto::ip4, "ip4", Kind::ip4},
    {Proto::tcp, "tcp", Kind::port},
    {Proto::udp, "udp", Kind::port},
    {Proto::dns, "dns", Kind::dns},
    {Proto::dns4, "dns4", Kind::dns},
    {Proto::dns6, "dns6", Kind::dns},
    {Proto::dnsaddr, "dnsaddr", Kind::dns},
    {Proto::ip6, "ip6", Kind::ip6},
    {Proto::p2p, "p2p", Kind::p2p},
    {Proto::p2p_circuit, "p2p-circuit", Kind::none},
    {Proto::quic, "quic", Kind::none},
    {Proto::quic_v1, "quic-v1", Kind::none},
    {Proto::ws, "ws", Kind::none},
    {Proto::wss, "wss", Kind::none},
}};

const ProtoInfo* find_by_name(std::string_view name) {
  if (name == "ipfs") name = "p2p";  // legacy alias, same code (421)
  for (const auto& p : kProtos) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

const ProtoInfo* find_by_code(std::uint64_t code) {
  for (const auto& p : kProtos) {
    if (static_cast<std::uint64_t>(p.code) == code) return &p;
  }
  return nullptr;
}

const ProtoInfo& info(Proto p) {
  const ProtoInfo* i = find_by_code(static_cast<std::uint64_t>(p));
  return *i;  // components only ever hold known protocols
}

Error bad(std::string why) {
  return make_error(errc::invalid_argument, "multiaddr: " + why);
}

// Shows untrusted text in an error message: bounded, with non-printable bytes escaped.
std::string printable(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < 64; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (s.size() > 64) out += "...";
  return out;
}

// Strict UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t n;
    std::uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= n) return false;
    for (std::size_t k = 1; k <= n; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr std::uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

// A DNS name as carried by dns/dns4/dns6/dnsaddr: non-empty UTF-8 without '/' or control bytes.
result<void> check_dns(std::string_view name) {
  if (name.empty()) return bad("empty DNS name");
  if (name.size() > kMaxDnsNameSize) {
    return bad("DNS name of " + std::to_string(name.size()) + " bytes is too long");
  }
  for (char ch : name) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f || c == '/') {
      return bad("invalid character in DNS name '" + printable(name) + "'");
    }
  }
  if (!valid_utf8(name)) return bad("DNS name is not valid UTF-8: '" + printable(name) + "'");
  return success();
}

// Parses the text value of a component into its binary value.
result<Bytes> value_from_text(const ProtoInfo& p, std::string_view v) {
  switch (p.kind) {
    case Kind::ip4: {
      // Only digits and dots reach the OS parser (no embedded NULs, no "1.2.3.4 junk").
      if (v.empty() || v.find_first_not_of("0123456789.") != std::string_view::npos) {
        return bad("invalid IPv4 address '" + printable(v) + "'");
      }
      std::error_code ec;
      auto a = asio::ip::make_address_v4(std::string(v), ec);
      if (ec) return bad("invalid IPv4 address '" + printable(v) + "'");
      auto b = a.to_bytes();
      return Bytes(b.begin(), b.end());
    }
    case Kind::ip6: {
      // No zone ("%eth0": that is the separate ip6zone protocol).
      if (v.empty() || v.find_first_not_of("0123456789abcdefABCDEF:.") != std::string_view::npos) {
        return bad("invalid IPv6 address '" + printable(v) + "'");
      }
      std::error_code ec;
      auto a = asio::ip::make_address_v6(std::string(v), ec);
      if (ec) return bad("invalid IPv6 address '" + printable(v) + "'");
      auto b = a.to_bytes();
      return Bytes(b.begin(), b.end());
    }
    case Kind::port: {
      unsigned port = 0;
      bool digits = !v.empty() && v.size() <= 5 &&
                    v.find_first_not_of("0123456789") == std::string_view::npos;
      if (digits) std::from_chars(v.data(), v.data() + v.size(), port);
      if (!digits || port > 65535) {
        return bad("invalid " + std::string(p.name) + " port '" + printable(v) + "'");
      }
      Bytes out;
      append_be16(out, static_cast<std::uint16_t>(port));
      return out;
    }
    case Kind::dns: {
      if (auto ok = check_dns(v); !ok) return ok.error();
      return to_bytes(v);
    }
    case Kind::p2p: {
      auto id = PeerId::from_string(v);
      if (!id) return id.error().with_context("multiaddr /p2p value");
      return copy_bytes(id.value().bytes());
    }
    case Kind::none:
      break;
  }
  return Bytes{};
}

std::string value_to_text(const ProtoInfo& p, const Bytes& v) {
  switch (p.kind) {
    case Kind::ip4: {
      asio::ip::address_v4::bytes_type b;
      std::copy_n(v.begin(), b.size(), b.begin());
      return asio::ip::address_v4(b).to_string();
    }
    case Kind::ip6: {
      asio::ip::address_v6::bytes_type b;
      std::copy_n(v.begin(), b.size(), b.begin());
      return asio::ip::address_v6(b).to_string();
    }
    case Kind::port:
      return std::to_string(load_be16(v.data()));
    case Kind::dns:
      return std::string(as_string(v));
    case Kind::p2p:
      return base58_encode(v);
    case Kind::none:
      break;
  }
  return {};
}

}  // namespace

std::string_view proto_name(Proto p) {
  const ProtoInfo* i = find_by_code(static_cast<std::uint64_t>(p));
  return i ? i->name : std::string_view("unknown");
}

result<Multiaddr> Multiaddr::parse(std::string_view text) {
  if (text.empty()) return bad("empty string");
  if (text.size() > kMaxMultiaddrTextSize) {
    return make_error(errc::too_large, "multiaddr: text of " + std::to_string(text.size()) +
                                           " bytes exceeds " +
                                           std::to_string(kMaxMultiaddrTextSize));
  }
  if (text[0] != '/') return bad("'" + printable(text) + "' does not start with '/'");
  std::string_view rest = text.substr(1);
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);  // one trailing '/' is fine
  if (rest.empty()) return bad("no components in '" + printable(text) + "'");

  std::vector<std::string_view> tokens;
  for (std::size_t start = 0;;) {
    auto slash = rest.find('/', start);
    tokens.push_back(rest.substr(start, slash == std::string_view::npos ? slash : slash - start));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }

  Multiaddr ma;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    std::string_view name = tokens[i];
    if (name.empty()) return bad("empty component in '" + printable(text) + "'");
    const ProtoInfo* p = find_by_name(name);
    if (!p) return bad("unknown protocol '" + printable(name) + "'");
    MultiaddrComponent c{p->code, {}};
    if (p->kind != Kind::none) {
      if (++i == tokens.size()) return bad("missing value for /" + std::string(p->name));
      auto v = value_from_text(*p, tokens[i]);
      if (!v) return v.error();
      c.value = std::move(v).value();
    }
    ma.parts_.push_back(std::move(c));
  }
  if (ma.to_bytes().size() > kMaxMultiaddrSize) {
    return make_error(errc::too_large, "multiaddr: binary form exceeds " +
                                           std::to_string(kMaxMultiaddrSize) + " bytes");
  }
  return ma;
}

result<Multiaddr> Multiaddr::from_bytes(BytesView bytes) {
  if (bytes.empty()) return bad("empty binary multiaddr");
  if (bytes.size() > kMaxMultiaddrSize) {
    return make_error(errc::too_large, "multiaddr: " + std::to_string(bytes.size()) +
                                           " bytes exceeds " + std::to_string(kMaxMultiaddrSize));
  }
  Multiaddr ma;
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    auto code = decode_uvarint(bytes.subspan(pos));
    if (!code) return bad("protocol code: " + code.error().context());
    if (!code.value()) return bad("truncated protocol code");
    pos += code.value()->length;
    const ProtoInfo* p = find_by_code(code.value()->value);
    if (!p) return bad(fmt::format("unknown protocol code 0x{:x}", code.value()->value));
    std::size_t remaining = bytes.size() - pos;
    std::size_t size = 0;
    switch (p->kind) {
      case Kind::ip4:
        size = 4;
        break;
      case Kind::ip6:
        size = 16;
        break;
      case Kind::port:
        size = 2;
        break;
      case Kind::none:
        size = 0;
        break;
      case Kind::dns:
      case Kind::p2p: {
        auto len = decode_uvarint(bytes.subspan(pos));
        if (!len) return bad("/" + std::string(p->name) + " length: " + len.error().context());
        if (!len.value()) return bad("truncated /" + std::string(p->name) + " length");
        pos += len.value()->length;
        remaining = bytes.size() - pos;
        if (len.value()->value > remaining) {
          return bad("/" + std::string(p->name) + " value truncated (" +
                     std::to_string(len.value()->value) + " bytes declared, " +
                     std::to_string(remaining) + " present)");
        }
        size = static_cast<std::size_t>(len.value()->value);
        break;
      }
    }
    if (size > remaining) {
      return bad("/" + std::string(p->name) + " value truncated (" + std::to_string(size) +
                 " bytes needed, " + std::to_string(remaining) + " present)");
    }
    BytesView value = bytes.subspan(pos, size);
    pos += size;
    if (p->kind == Kind::dns) {
      if (auto ok = check_dns(as_string(value)); !ok) return ok.error();
    } else if (p->kind == Kind::p2p) {
      auto id = PeerId::from_bytes(value);
      if (!id) return id.error().with_context("multiaddr /p2p value");
    }
    ma.parts_.push_back({p->code, Bytes(value.begin(), value.end())});
  }
  return ma;
}

Multiaddr Multiaddr::from_tcp_endpoint(const asio::ip::tcp::endpoint& ep) {
  Multiaddr ma;
  auto addr = ep.address();
  if (addr.is_v6() && addr.to_v6().is_v4_mapped()) {
    addr = asio::ip::make_address_v4(asio::ip::v4_mapped, addr.to_v6());
  }
  if (addr.is_v4()) {
    auto b = addr.to_v4().to_bytes();
    ma.parts_.push_back({Proto::ip4, Bytes(b.begin(), b.end())});
  } else {
    auto b = addr.to_v6().to_bytes();
    ma.parts_.push_back({Proto::ip6, Bytes(b.begin(), b.end())});
  }
  Bytes port;
  append_be16(port, ep.port());
  ma.parts_.push_back({Proto::tcp, std::move(port)});
  return ma;
}

std::string Multiaddr::to_string() const {
  std::string out;
  for (const auto& c : parts_) {
    const ProtoInfo& p = info(c.proto);
    out.push_back('/');
    out += p.name;
    if (p.kind != Kind::none) {
      out.push_back('/');
      out += value_to_text(p, c.value);
    }
  }
  return out;
}

Bytes Multiaddr::to_bytes() const {
  Bytes out;
  for (const auto& c : parts_) {
    append_uvarint(out, static_cast<std::uint64_t>(c.proto));
    Kind k = info(c.proto).kind;
    if (k == Kind::dns || k == Kind::p2p) append_uvarint(out, c.value.size());
    out.insert(out.end(), c.value.begin(), c.value.end());
  }
  return out;
}

std::optional<PeerId> Multiaddr::peer_id() const {
  if (parts_.empty() || parts_.back().proto != Proto::p2p) return std::nullopt;
  auto id = PeerId::from_bytes(parts_.back().value);
  if (!id) return std::nullopt;  // cannot happen: values are validated on the way in
  return std::move(id).value();
}

Multiaddr Multiaddr::with_peer_id(const PeerId& id) const {
  Multiaddr ma = without_peer_id();
  if (id.valid()) ma.parts_.push_back({Proto::p2p, copy_bytes(id.bytes())});
  return ma;
}

Multiaddr Multiaddr::without_peer_id() const {
  Multiaddr ma = *this;
  if (!ma.parts_.empty() && ma.parts_.back().proto == Proto::p2p) ma.parts_.pop_back();
  return ma;
}

bool Multiaddr::is_circuit() const {
  return std::any_of(parts_.begin(), parts_.end(),
                     [](const auto& c) { return c.proto == Proto::p2p_circuit; });
}

result<std::pair<Multiaddr, std::optional<PeerId>>> Multiaddr::circuit_parts() const {
  auto it = std::find_if(parts_.begin(), parts_.end(),
                         [](const auto& c) { return c.proto == Proto::p2p_circuit; });
  if (it == parts_.end() || it == parts_.begin() || std::prev(it)->proto != Proto::p2p)
    return make_error(errc::invalid_argument,
                      "'" + to_string() + "' is not <relay>/p2p/<id>/p2p-circuit[/p2p/<id>]");
  Multiaddr relay;
  relay.parts_.assign(parts_.begin(), it);
  std::optional<PeerId> target;
  auto rest = std::distance(it, parts_.end());
  if (rest == 2 && std::next(it)->proto == Proto::p2p) {
    ST_TRY(auto id, PeerId::from_bytes(std::next(it)->value));
    target = id;
  } else if (rest != 1) {
    return make_error(errc::invalid_argument,
                      "'" + to_string() + "': only /p2p/<id> may follow /p2p-circuit");
  }
  return std::make_pair(std::move(relay), std::move(target));
}

Multiaddr Multiaddr::with_circuit() const {
  Multiaddr ma = *this;
  ma.parts_.push_back({Proto::p2p_circuit, {}});
  return ma;
}

result<asio::ip::tcp::endpoint> Multiaddr::to_tcp_endpoint() const {
  auto& p = parts_;
  bool shape = (p.size() == 2 || (p.size() == 3 && p[2].proto == Proto::p2p)) &&
               (p[0].proto == Proto::ip4 || p[0].proto == Proto::ip6) && p[1].proto == Proto::tcp;
  if (!shape) {
    return make_error(errc::unsupported, "multiaddr '" + to_string() +
                                             "' is not /ip4|ip6/<addr>/tcp/<port>[/p2p/<id>]");
  }
  std::uint16_t port = load_be16(p[1].value.data());
  if (p[0].proto == Proto::ip4) {
    asio::ip::address_v4::bytes_type b;
    std::copy_n(p[0].value.begin(), b.size(), b.begin());
    return asio::ip::tcp::endpoint(asio::ip::address_v4(b), port);
  }
  asio::ip::address_v6::bytes_type b;
  std::copy_n(p[0].value.begin(), b.size(), b.begin());
  return asio::ip::tcp::endpoint(asio::ip::address_v6(b), port);
}

std::optional<std::pair<std::string, std::uint16_t>> Multiaddr::dns_tcp() const {
  auto& p = parts_;
  bool shape =
      (p.size() == 2 || (p.size() == 3 && p[2].proto == Proto::p2p)) &&
      (p[0].proto == Proto::dns || p[0].proto == Proto::dns4 || p[0].proto == Proto::dns6) &&
      p[1].proto == Proto::tcp;
  if (!shape) return std::nullopt;
  return std::make_pair(std::string(as_string(p[0].value)), load_be16(p[1].value.data()));
}

}  // namespace starling::net
