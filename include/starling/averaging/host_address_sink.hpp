// The averager's AddressSink for a net::Host: tells the host where group members and state
// donors listen (the multiaddrs they announce in the directory), so it can dial peers it has no
// connection to yet. Holds the host weakly.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "starling/averaging/averager.hpp"
#include "starling/net/host.hpp"

namespace starling::averaging {

inline Averager::AddressSink host_address_sink(const std::shared_ptr<net::Host>& host) {
  std::weak_ptr<net::Host> wh = host;
  return [wh](const net::PeerId& peer, const std::vector<std::string>& addrs) {
    auto h = wh.lock();
    if (!h) return;
    std::vector<net::Multiaddr> ms;
    for (const auto& a : addrs)
      if (auto m = net::Multiaddr::parse(a)) ms.push_back(m.value());
    h->add_addresses(peer, ms);
  };
}

}  // namespace starling::averaging
