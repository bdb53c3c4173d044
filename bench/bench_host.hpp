// A started libp2p host on loopback defaults for the benchmarks, or exit(1) with the reason.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "starling/core/blocking.hpp"
#include "starling/crypto/keys.hpp"
#include "starling/net/host.hpp"

namespace starling::bench {

inline std::shared_ptr<net::Host> start_host_or_exit(IoThread& io) {
  auto h = net::Host::create(io.executor(), crypto::KeyPair::generate(), net::HostConfig{});
  auto r = block_on(
      io.executor(), [h] { return h->start(); }, std::chrono::seconds(10));
  if (!r) {
    std::fprintf(stderr, "host: %s\n", r.error().message().c_str());
    std::exit(1);
  }
  return h;
}

}  // namespace starling::bench
