// A pre-scan of protobuf wire bytes against a small table of the fields a message may carry,
// run before the protobuf parser sees bytes from a peer: every tag must name a known field
// with its wire type, singular fields appear at most once, repeated ones at most max_count
// times, and every length is checked against the bytes left and the field's own max_len
// before anything is allocated (the parser then never allocates from a claimed size). Nested
// messages are scanned with their own table, to a bounded depth. No allocation.
//
// Threading rule: pure functions over constant tables.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "starling/core/bytes.hpp"
#include "starling/core/error.hpp"

namespace starling::averaging::wire::scan {

enum class Kind : std::uint8_t {
  varint,   // int32/64, uint32/64, bool, enum (repeated: packed form accepted too)
  fixed64,  // double
  bytes,    // bytes or string
  message,  // a nested message scanned with `sub`
};

struct Schema;

struct Field {
  std::uint32_t number = 0;
  Kind kind = Kind::varint;
  std::uint32_t max_count = 1;  // 1: singular
  std::uint32_t max_len = 0;    // bytes / message / packed: the largest length
  const Schema* sub = nullptr;  // message fields
};

struct Schema {
  const char* name;
  std::span<const Field> fields;  // at most kMaxFields
};

inline constexpr std::size_t kMaxFields = 16;
inline constexpr int kMaxDepth = 4;

// Errors: errc::invalid_argument naming the message, the field and the reason.
result<void> check(BytesView b, const Schema& s);

// The averaging protocol's messages (proto/averaging.proto).
extern const Schema kMember, kMatchEntry, kGroup, kJoinRequest, kMatchFrame, kFinReport,
    kRoundFrame, kStateRequest, kStateManifest, kStateFrame, kStateAnnouncement;

// Scans `b` with `s`, then parses it as Msg (a generated protobuf message).
template <class Msg>
result<Msg> parse(BytesView b, const Schema& s) {
  if (auto r = check(b, s); !r) return r.error();
  Msg m;
  if (!m.ParseFromArray(b.data(), static_cast<int>(b.size())))
    return Error(errc::invalid_argument, std::string("averaging wire: unparsable ") + s.name);
  return m;
}

}  // namespace starling::averaging::wire::scan
