// Private helpers of circuit relay v2 shared by the relay service, the relay client and the
// host's /p2p-circuit dialer.
#pragma once

#include <utility>

#include "starling/net/byte_stream.hpp"
#include "starling/net/relay.hpp"
#include "starling/pb/circuit.pb.h"

namespace starling::net {

// Reads one length-prefixed message (at most kMaxRelayMessage bytes) and returns it with the
// bytes read past it: after a STATUS OK those belong to the relayed connection.
awaitable<result<std::pair<Bytes, Bytes>>> read_relay_message(ByteStream& s, Duration timeout);

// Parses a hop/stop message: errc::invalid_argument if the protobuf is malformed or lacks a
// required field.
result<pb::HopMessage> parse_hop(BytesView b);
result<pb::StopMessage> parse_stop(BytesView b);
Bytes encode_message(const google::protobuf::MessageLite& m);

// Writes a STATUS-only reply.
awaitable<result<void>> write_hop_status(ByteStream& s, RelayStatus st);
awaitable<result<void>> write_stop_status(ByteStream& s, RelayStatus st);

}  // namespace starling::net
