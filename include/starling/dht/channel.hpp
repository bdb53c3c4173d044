// The DHT request channel `/starling/dht/1.1.0`: one long-lived stream per (requester,
// server) pair carrying many requests and their answers, matched by request id, instead of a
// typed RPC stream per request (`/starling/dht/1.0.0`, still served and used as the fallback).
//
// WIRE FORMAT (both directions): frames, each a uvarint length then the body
//   body = uvarint request id, then one DHT message in the DHT's own codec (messages.hpp):
//          requester -> server: a Request; server -> requester: the Response to that id.
// The server answers in arrival order; ids are the requester's (unique per channel, any
// order). A frame longer than the limit, a body that does not parse, a request the DHT codec
// refuses, or an answer to an id never sent closes the stream (reset) with a logged reason.
// The requester closes a channel when it idles or when a request outlives its deadline
// unanswered; the server closes one that completes no answer for its idle period. Both ends
// bound how many channels one peer may hold (DhtNodeConfig).
//
// Pure codec functions here (fuzzed by fuzz/fuzz_dht_channel.cpp); the I/O is in
// src/dht/node_channel.cpp.
#pragma once

#include <cstdint>

#include "starling/core/bytes.hpp"
#include "starling/core/result.hpp"

namespace starling::dht {

inline constexpr const char* kDhtChannelProtocol = "/starling/dht/1.1.0";

// The largest frame body for messages of up to `max_message_bytes` (the id's 10 bytes more).
inline std::size_t channel_frame_limit(std::size_t max_message_bytes) {
  return max_message_bytes + 10;
}

struct ChannelFrame {
  std::uint64_t id = 0;
  BytesView message;  // points into the body given to decode_channel_frame
};

// One whole frame, length prefix included: uvarint(len) uvarint(id) message.
Bytes encode_channel_frame(std::uint64_t id, BytesView message);
// A frame body (without its length prefix). errc::invalid_argument if the id is missing or
// malformed, or the message is empty.
result<ChannelFrame> decode_channel_frame(BytesView body);

}  // namespace starling::dht
