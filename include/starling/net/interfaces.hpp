// The host's interface addresses, and listen addresses made dialable: a socket bound to
// 0.0.0.0 or :: is reachable at each interface address, and those (not the unspecified
// address) are what a node announces and prints. Threading: plain functions, any thread.
#pragma once

#include <vector>

#include <asio/ip/address.hpp>

#include "starling/net/multiaddr.hpp"

namespace starling::net {

// Addresses of the interfaces that are up (getifaddrs), IPv4 and IPv6, without IPv6
// link-local ones (they need a scope id); non-loopback first, loopback last. Empty on error.
std::vector<asio::ip::address> interface_addresses();

// Replaces each /ip4/0.0.0.0/... (/ip6/::/...) in `addrs` by one address per IPv4 (IPv6)
// entry of `interfaces`, keeping the rest of the multiaddr; other addresses are kept as they
// are. Result: without duplicates, non-loopback addresses first and loopback ones last (each
// group in input order). Pure: testable with any interface list.
std::vector<Multiaddr> expand_unspecified(const std::vector<Multiaddr>& addrs,
                                          const std::vector<asio::ip::address>& interfaces);

// The IP address of an /ip4 or /ip6 multiaddr (first component), if it has one.
std::optional<asio::ip::address> multiaddr_ip(const Multiaddr& addr);

// Whether an address is worth announcing to the internet: not loopback, private (RFC 1918,
// fc00::/7), link-local, CGNAT (100.64/10), unspecified or documentation ranges.
bool is_public_ip(const asio::ip::address& ip);

}  // namespace starling::net
