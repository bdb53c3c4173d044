// Interface addresses (getifaddrs) and the expansion of unspecified listen addresses.
#include "starling/net/interfaces.hpp"

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <array>
#include <cstring>

namespace starling::net {

namespace {
bool is_loopback(const Multiaddr& a) {
  auto ip = multiaddr_ip(a);
  return ip && ip->is_loopback();
}

bool in_v4(const asio::ip::address_v4& ip, std::uint32_t net, int bits) {
  const std::uint32_t mask = bits == 0 ? 0 : ~std::uint32_t{0} << (32 - bits);
  return (ip.to_uint() & mask) == (net & mask);
}
}  // namespace

std::vector<asio::ip::address> interface_addresses() {
  std::vector<asio::ip::address> front, back;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {};
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    asio::ip::address ip;
    if (i->ifa_addr->sa_family == AF_INET) {
      sockaddr_in sa;
      std::memcpy(&sa, i->ifa_addr, sizeof sa);
      ip = asio::ip::address_v4(ntohl(sa.sin_addr.s_addr));
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      sockaddr_in6 sa;
      std::memcpy(&sa, i->ifa_addr, sizeof sa);
      asio::ip::address_v6::bytes_type b;
      std::memcpy(b.data(), &sa.sin6_addr, b.size());
      auto v6 = asio::ip::address_v6(b);
      if (v6.is_link_local()) continue;
      ip = v6;
    } else {
      continue;
    }
    auto& dst = ip.is_loopback() ? back : front;
    if (std::find(dst.begin(), dst.end(), ip) == dst.end()) dst.push_back(ip);
  }
  freeifaddrs(list);
  front.insert(front.end(), back.begin(), back.end());
  return front;
}

std::optional<asio::ip::address> multiaddr_ip(const Multiaddr& addr) {
  if (addr.empty()) return std::nullopt;
  const auto& c = addr.components().front();
  if (c.proto == Proto::ip4 && c.value.size() == 4) {
    asio::ip::address_v4::bytes_type b;
    std::copy_n(c.value.begin(), 4, b.begin());
    return asio::ip::address_v4(b);
  }
  if (c.proto == Proto::ip6 && c.value.size() == 16) {
    asio::ip::address_v6::bytes_type b;
    std::copy_n(c.value.begin(), 16, b.begin());
    return asio::ip::address_v6(b);
  }
  return std::nullopt;
}

std::vector<Multiaddr> expand_unspecified(const std::vector<Multiaddr>& addrs,
                                          const std::vector<asio::ip::address>& interfaces) {
  std::vector<Multiaddr> all;
  auto add = [&](const Multiaddr& a) {
    if (std::find(all.begin(), all.end(), a) == all.end()) all.push_back(a);
  };
  for (const auto& a : addrs) {
    auto ip = multiaddr_ip(a);
    if (!ip || !ip->is_unspecified()) {
      add(a);
      continue;
    }
    for (const auto& iface : interfaces) {
      if (iface.is_v4() != ip->is_v4()) continue;
      std::string text = a.to_string();
      // Replace the first component's value; the rest of the multiaddr stays as it was.
      auto rest = text.substr(text.find('/', 1));
      rest = rest.substr(rest.find('/', 1));
      auto m = Multiaddr::parse((iface.is_v4() ? "/ip4/" : "/ip6/") + iface.to_string() + rest);
      if (m) add(m.value());
    }
  }
  std::stable_partition(all.begin(), all.end(), [](const Multiaddr& a) { return !is_loopback(a); });
  return all;
}

bool is_public_ip(const asio::ip::address& ip) {
  if (ip.is_unspecified() || ip.is_loopback() || ip.is_multicast()) return false;
  if (ip.is_v4()) {
    auto v4 = ip.to_v4();
    static constexpr std::array<std::pair<std::uint32_t, int>, 10> kPrivate{{
        {0x0A000000, 8},   // 10/8
        {0x64400000, 10},  // 100.64/10 (CGNAT)
        {0xA9FE0000, 16},  // 169.254/16
        {0xAC100000, 12},  // 172.16/12
        {0xC0A80000, 16},  // 192.168/16
        {0xC6120000, 15},  // 198.18/15
        {0xC0000200, 24},  // 192.0.2/24 (TEST-NET-1)
        {0xC6336400, 24},  // 198.51.100/24 (TEST-NET-2)
        {0xCB007100, 24},  // 203.0.113/24 (TEST-NET-3)
        {0x00000000, 8},   // 0/8
    }};
    for (auto [net, bits] : kPrivate)
      if (in_v4(v4, net, bits)) return false;
    return true;
  }
  auto v6 = ip.to_v6();
  if (v6.is_v4_mapped()) return is_public_ip(asio::ip::make_address_v4(asio::ip::v4_mapped, v6));
  auto b = v6.to_bytes();
  if ((b[0] & 0xfe) == 0xfc) return false;  // fc00::/7 unique local
  if (v6.is_link_local() || v6.is_site_local()) return false;
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d && b[3] == 0xb8) return false;  // 2001:db8::/32
  return true;
}

}  // namespace starling::net
