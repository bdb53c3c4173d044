// Wire codec of the averaging protocols (proto/averaging.proto) to and from the cores' types.
// Parsers are pure functions that reject, with errc::invalid_argument / too_large and a reason,
// anything malformed or out of bounds; they are fuzzed (fuzz/fuzz_averaging_*.cpp).
//
// Threading rule: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <variant>

#include "starling/averaging/matchmaking_core.hpp"
#include "starling/averaging/round_core.hpp"
#include "starling/averaging/state_transfer.hpp"

namespace starling::averaging {

inline constexpr const char* kJoinProtocol = "/starling/averaging/join/1.0.0";
inline constexpr const char* kAllReduceProtocol = "/starling/averaging/allreduce/2.1.0";
inline constexpr const char* kStateProtocol = "/starling/averaging/state/1.0.0";

}  // namespace starling::averaging

namespace starling::averaging::wire {

inline constexpr std::size_t kMaxFrame = 1 << 20;  // one protobuf frame (not the payload)
inline constexpr std::size_t kMaxParts = 1 << 24;  // parts in one sub-round
inline constexpr std::size_t kMaxAddrs = 32;
inline constexpr std::size_t kMaxAddrLen = 1024;
inline constexpr std::size_t kMaxPeerIdLen = 128;

// --- members, entries, groups ---
Bytes encode_entry(const MatchEntry& e);
result<MatchEntry> decode_entry(BytesView b);
std::int64_t to_unix_ms(WallTime t);
WallTime from_unix_ms(std::int64_t ms);

// --- join stream ---
using MatchFrame =
    std::variant<JoinRequest, JoinReply, BeginMsg, ConfirmMsg, StartMsg, DisbandMsg, LeaveMsg>;
Bytes encode_match(const MatchFrame& m);
result<MatchFrame> decode_match(BytesView b);

// --- all-reduce stream ---
struct Hello {
  Bytes group_id;
  std::uint32_t from = 0;
  std::uint32_t to = 0;
};
struct Keepalive {};
// An accountability statement (accountability.hpp encodings; the round runner decodes it).
struct Acct {
  Bytes statement;
};
// A decoded round frame. PART and RESULT carry `payload_len` bytes after the frame; the data
// span of the returned message is empty until the caller attaches the decoded payload.
// `receipt`: the signed DataReceipt of a PART or RESULT (accountable rounds; else empty).
struct RoundFrame {
  std::variant<Hello, Keepalive, RoundMessage, Acct> msg;
  std::uint64_t payload_len = 0;
  Bytes receipt;
};
Bytes encode_hello(const Hello& h);
Bytes encode_keepalive();
Bytes encode_acct(BytesView statement);
// Encodes `m` without its float data; PART/RESULT frames announce `payload_len` bytes and
// carry `receipt` when it is not empty.
Bytes encode_round(const RoundMessage& m, std::uint64_t payload_len = 0, BytesView receipt = {});
// `members`: the group size (bitsets over members are checked against it).
result<RoundFrame> decode_round(BytesView b, std::size_t members);

// --- state transfer ---
inline constexpr std::size_t kMaxStateParts = 1 << 22;
inline constexpr std::size_t kMaxMetadata = 1 << 16;
inline constexpr std::size_t kMaxStatePartBytes = std::size_t{64} << 20;
inline constexpr std::uint64_t kMaxStateBytes = std::uint64_t{1} << 40;
Bytes encode_announcement(const StateAnnouncement& a);
result<StateAnnouncement> decode_announcement(BytesView b);
Bytes encode_state_request(const StateRequest& r);
result<StateRequest> decode_state_request(BytesView b);
Bytes encode_state_frame(const StateFrame& f);
result<StateFrame> decode_state_frame(BytesView b);

}  // namespace starling::averaging::wire
