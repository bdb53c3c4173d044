// multistream-select 1.0 (multiformats/multistream-select): protocol negotiation on a fresh
// stream. Messages are uvarint-length-prefixed UTF-8 lines ending in '\n'; both sides first
// send "/multistream/1.0.0"; the dialer proposes protocols one at a time, the listener echoes
// the one it accepts or answers "na". "ls" is answered with "na" (optional in the spec).
//
// The dialer pipelines the header and its first proposal in one write (one round trip when
// the first choice is accepted). Bytes that arrive after the negotiation (the peer may send
// data right away) are never lost: the returned stream yields them first.
//
// Threading rule: like ByteStream, call from coroutines on the stream's executor.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "starling/net/byte_stream.hpp"

namespace starling::net {

inline constexpr std::string_view kMultistreamHeader = "/multistream/1.0.0";
inline constexpr std::size_t kMaxMultistreamMessage = 1024;  // bytes, including '\n'
inline constexpr int kMaxProposals = 32;  // a listener gives up after this many "na"s

struct Negotiated {
  std::string protocol;
  ByteStreamPtr stream;  // the same stream, yielding any bytes read past the negotiation
};

// Dialer side: proposes `protocols` in order; errc::unsupported (naming them) if the listener
// accepts none. Bounded by `timeout`.
awaitable<result<Negotiated>> multistream_select(ByteStreamPtr stream,
                                                 std::vector<std::string> protocols,
                                                 Duration timeout);

// Listener side: answers proposals; `supported` decides which protocol ids are accepted.
awaitable<result<Negotiated>> multistream_handle(ByteStreamPtr stream,
                                                 std::function<bool(std::string_view)> supported,
                                                 Duration timeout);

// Pure codec (fuzzable): encodes one message; decodes one message at the start of `in`.
Bytes multistream_encode(std::string_view msg);
struct MultistreamMessage {
  std::string text;  // without the trailing '\n'
  std::size_t consumed;
};
// std::nullopt = need more bytes. Errors: too long, missing '\n', bad varint, embedded '\n'.
result<std::optional<MultistreamMessage>> multistream_decode(BytesView in);

}  // namespace starling::net
