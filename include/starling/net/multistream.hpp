// multistream-select 1.0 (multiformats/multistream-select): protocol negotiation on a fresh
// stream. Messages are uvarint-length-prefixed UTF-8 lines ending in '\n'; both sides first
// send "/multistream/1.0.0"; the dialer proposes protocols one at a time, the listener echoes
// the one it accepts or answers "na". "ls" is answered with "na" (optional in the spec).
//
// The dialer pipelines the header and its first proposal in one write (one round trip when
// the first choice is accepted). Bytes that arrive after the negotiation (the peer may send
// data right away) are never lost: the returned stream yields them first.
//
// Lazy ("optimistic") select, for a dialer proposing exactly one protocol: the header, the
// proposal and the first application bytes go out in one write without waiting for the
// listener; the listener's answer is read in front of the first response bytes. This saves
// the negotiation's round trip on every stream (libp2p allows it for a single proposal). A
// refusal ("na") fails that stream's reads and writes with errc::unsupported naming the
// protocol.
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

// Dialer side, lazy: returns at once a stream that puts the header and `protocol` in front of
// its first write (or sends them before its first read or close_write) and checks the
// listener's answer before its first read returns. At most kLazyOptimisticBytes of
// application data go out before the answer (so a refused stream never waits on flow
// control); a larger write waits for it. Answer: the protocol echo -> reads continue with the
// bytes after it; "na" -> errc::unsupported ("peer does not support <protocol>") from every
// later read and write, and the stream is reset; anything else -> errc::protocol_violation.
// The caller bounds the wait for the answer with its own deadline (like any read).
inline constexpr std::size_t kLazyOptimisticBytes = 64 * 1024;
ByteStreamPtr multistream_select_lazy(ByteStreamPtr stream, std::string protocol);

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
// The listener's answer to a lazy proposal of `protocol` at the start of `in`: the header then
// the echo. Returns the bytes consumed, std::nullopt = need more. Errors: errc::unsupported
// for "na", errc::protocol_violation for another header or answer, the codec's errors.
result<std::optional<std::size_t>> multistream_parse_answer(BytesView in,
                                                            std::string_view protocol);

}  // namespace starling::net
