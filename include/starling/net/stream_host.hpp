// StreamHost: the seam between the transport (Host: connections, security, muxing) and the
// protocols that run on it (identify, ping, RPC, DHT, averaging). A protocol registers a
// handler for its protocol id and opens streams to peers by protocol id; how the stream is
// dialled, secured, multiplexed and negotiated is the host's business.
#pragma once

#include <functional>
#include <string>

#include <asio/any_io_executor.hpp>

#include "starling/net/byte_stream.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::net {

// Called for each inbound stream negotiated to the handler's protocol. The handler owns the
// stream; it runs inside the host's task scope and is cancelled when the host stops.
using StreamHandler = std::function<awaitable<void>(ByteStreamPtr stream, PeerId remote)>;

class StreamHost {
 public:
  virtual ~StreamHost() = default;
  // Opens a new stream to `peer` (connecting first if needed) negotiated to `protocol`.
  // Errors name the peer, the protocol and the cause; errc::timeout after `timeout`. A host
  // may negotiate lazily (net::Host does by default): then a peer that does not serve
  // `protocol` shows as errc::unsupported on the stream's first read, not here.
  virtual awaitable<result<ByteStreamPtr>> open_stream(const PeerId& peer, std::string protocol,
                                                       Duration timeout) = 0;
  // Registers (or replaces) the handler for `protocol`.
  virtual void set_stream_handler(std::string protocol, StreamHandler handler) = 0;
  virtual void remove_stream_handler(const std::string& protocol) = 0;
  virtual const PeerId& local_peer() const = 0;
  virtual asio::any_io_executor get_executor() = 0;
};

}  // namespace starling::net
