// /starling/echo/1.0.0: echoes every byte back until the dialer closes its write side.
// Used by the CLI, the demo, benchmarks and the js-libp2p interop test.
#pragma once

#include "starling/net/rpc.hpp"
#include "starling/net/stream_host.hpp"

namespace starling::net {

inline constexpr const char* kEchoProtocol = "/starling/echo/1.0.0";

void install_echo(StreamHost& host);
// Sends `data` and reads the echo back (writing and reading concurrently).
awaitable<result<Bytes>> echo(StreamHost& host, const PeerId& peer, BytesView data,
                              Duration timeout);

// The same service as a typed unary RPC (google.protobuf.BytesValue in and out).
inline constexpr const char* kRpcEchoProtocol = "/starling/rpc/echo/1.0.0";
void install_rpc_echo(RpcServer& server);
awaitable<result<Bytes>> rpc_echo(RpcClient& client, const PeerId& peer, BytesView data,
                                  Duration timeout);

}  // namespace starling::net
