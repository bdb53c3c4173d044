// /starling/echo/1.0.0: echoes every byte back until the dialer closes its write side.
// Used by the CLI, the demo, benchmarks and the js-libp2p interop test.
#pragma once

#include "starling/net/stream_host.hpp"

namespace starling::net {

inline constexpr const char* kEchoProtocol = "/starling/echo/1.0.0";

void install_echo(StreamHost& host);
// Sends `data` and reads the echo back (writing and reading concurrently).
awaitable<result<Bytes>> echo(StreamHost& host, const PeerId& peer, BytesView data,
                              Duration timeout);

}  // namespace starling::net
