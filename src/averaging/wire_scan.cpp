// The pre-scan of averaging protobuf frames (wire_scan.hpp) and the protocol's field tables.
#include "wire_scan.hpp"

#include <array>
#include <string>

#include "starling/averaging/types.hpp"
#include "starling/averaging/wire.hpp"

namespace starling::averaging::wire::scan {
namespace {

Error bad(const Schema& s, std::uint32_t field, const std::string& why) {
  return Error(errc::invalid_argument, std::string("averaging wire: ") + s.name + " field " +
                                           std::to_string(field) + ": " + why);
}

// A protobuf varint (up to 10 bytes, any 64-bit value) at b[pos]; false if it does not end.
bool read_varint(BytesView b, std::size_t& pos, std::uint64_t& v) {
  v = 0;
  for (int i = 0; i < 10 && pos < b.size(); ++i) {
    const std::uint8_t byte = b[pos++];
    v |= static_cast<std::uint64_t>(byte & 0x7f) << (7 * i);
    if (!(byte & 0x80)) return true;
  }
  return false;
}

result<void> check_at(BytesView b, const Schema& s, int depth) {
  if (depth > kMaxDepth) return bad(s, 0, "nested too deep");
  std::array<std::uint32_t, kMaxFields> count{};
  std::size_t pos = 0;
  while (pos < b.size()) {
    std::uint64_t tag = 0;
    if (!read_varint(b, pos, tag) || tag > 0xffffffffu) return bad(s, 0, "bad tag");
    const auto number = static_cast<std::uint32_t>(tag >> 3);
    const auto wt = static_cast<std::uint32_t>(tag & 7);
    std::size_t i = 0;
    while (i < s.fields.size() && s.fields[i].number != number) ++i;
    if (i == s.fields.size()) return bad(s, number, "unknown field");
    const Field& f = s.fields[i];
    if (++count[i] > f.max_count) return bad(s, number, "repeated too often");
    // (a packed chunk counts once here and once per element below)
    std::uint64_t v = 0;
    if (f.kind == Kind::varint && wt == 0) {
      if (!read_varint(b, pos, v)) return bad(s, number, "truncated varint");
      continue;
    }
    if (f.kind == Kind::fixed64 && wt == 1) {
      if (b.size() - pos < 8) return bad(s, number, "truncated fixed64");
      pos += 8;
      continue;
    }
    const bool packed = f.kind == Kind::varint && f.max_count > 1;
    if (wt != 2 || !(f.kind == Kind::bytes || f.kind == Kind::message || packed))
      return bad(s, number, "wrong wire type " + std::to_string(wt));
    std::uint64_t len = 0;
    if (!read_varint(b, pos, len)) return bad(s, number, "truncated length");
    if (len > b.size() - pos) return bad(s, number, "length beyond the frame");
    if (len > f.max_len) return bad(s, number, "length " + std::to_string(len) + " too large");
    const BytesView body = b.subspan(pos, static_cast<std::size_t>(len));
    pos += static_cast<std::size_t>(len);
    if (f.kind == Kind::message) {
      if (auto r = check_at(body, *f.sub, depth + 1); !r) return r;
    } else if (packed) {
      // Packed elements count against max_count like unpacked ones.
      std::size_t p = 0;
      std::uint32_t n = 0;
      while (p < body.size()) {
        if (!read_varint(body, p, v)) return bad(s, number, "truncated packed varint");
        ++n;
      }
      if ((count[i] += n) > f.max_count + 1) return bad(s, number, "repeated too often");
    }
  }
  return success();
}

constexpr std::uint32_t kId = 64;      // group ids, snapshot ids, hashes
constexpr std::uint32_t kText = 4096;  // reasons, keys
constexpr std::uint32_t kFrame = static_cast<std::uint32_t>(kMaxFrame);
constexpr std::uint32_t kGroupBits = (kMaxGroupSize + 7) / 8;
constexpr std::uint32_t kMembers = kMaxGroupSize;
constexpr std::uint32_t kMaxReceipt = 512 + 4 * kMaxGroupSize;  // a signed DataReceipt

constexpr Field kMemberF[] = {{1, Kind::bytes, 1, kMaxPeerIdLen},
                              {2, Kind::bytes, kMaxAddrs, kMaxAddrLen},
                              {3, Kind::varint},
                              {4, Kind::varint},
                              {5, Kind::fixed64}};
constexpr Field kMatchEntryF[] = {{1, Kind::message, 1, kFrame, &scan::kMember},
                                  {2, Kind::bytes, 1, kId},
                                  {3, Kind::varint},
                                  {4, Kind::varint},
                                  {5, Kind::varint}};
constexpr Field kGroupF[] = {{1, Kind::bytes, 1, kId},
                             {2, Kind::message, kMembers, kFrame, &scan::kMember},
                             {3, Kind::bytes, 1, kId}};
constexpr Field kJoinRequestF[] = {{1, Kind::message, 1, kFrame, &scan::kMember},
                                   {2, Kind::bytes, 1, kId},
                                   {3, Kind::bytes, 1, kText},
                                   {4, Kind::varint}};
constexpr Field kMatchFrameF[] = {{1, Kind::message, 1, kFrame, &kJoinRequest},
                                  {2, Kind::varint},
                                  {3, Kind::bytes, 1, kId},
                                  {4, Kind::bytes, 1, kId},
                                  {5, Kind::message, 1, kFrame, &kGroup},
                                  {6, Kind::bytes, 1, kText},
                                  {7, Kind::varint}};
constexpr Field kFinReportF[] = {{1, Kind::varint},
                                 {2, Kind::bytes, 1, kFrame},
                                 {3, Kind::bytes, 1, kGroupBits},
                                 {4, Kind::bytes, 1, kGroupBits},
                                 {5, Kind::bytes, 1, kGroupBits}};
constexpr Field kRoundFrameF[] = {{1, Kind::varint},
                                  {2, Kind::varint},
                                  {3, Kind::varint},
                                  {4, Kind::bytes, 1, kGroupBits},
                                  {5, Kind::varint},
                                  {6, Kind::message, kMembers, kFrame, &kFinReport},
                                  {7, Kind::varint},
                                  {8, Kind::bytes, 1, kId},
                                  {9, Kind::varint},
                                  {10, Kind::varint},
                                  {11, Kind::fixed64},
                                  {12, Kind::bytes, 1, kFrame},
                                  {13, Kind::bytes, 1, kMaxReceipt}};
constexpr Field kStateRequestF[] = {
    {1, Kind::varint}, {2, Kind::bytes, 1, kId}, {3, Kind::varint, 256, 256 * 5}};
constexpr Field kStateManifestF[] = {
    {1, Kind::bytes, 1, kId},          {2, Kind::varint}, {3, Kind::bytes, 1, kMaxMetadata},
    {4, Kind::bytes, 1, kId},          {5, Kind::varint}, {6, Kind::varint},
    {7, Kind::bytes, kFrame / 32, kId}};
constexpr Field kStateFrameF[] = {{1, Kind::message, 1, kFrame, &kStateManifest},
                                  {2, Kind::varint},
                                  {3, Kind::varint},
                                  {4, Kind::bytes, 1, kText}};
constexpr Field kStateAnnouncementF[] = {{1, Kind::message, 1, kFrame, &scan::kMember},
                                         {2, Kind::varint},
                                         {3, Kind::bytes, 1, kId},
                                         {4, Kind::varint}};

}  // namespace

result<void> check(BytesView b, const Schema& s) {
  if (b.size() > kMaxFrame) return Error(errc::too_large, std::string("averaging wire: ") + s.name);
  return check_at(b, s, 0);
}

const Schema kMember{"member", kMemberF};
const Schema kMatchEntry{"match entry", kMatchEntryF};
const Schema kGroup{"group", kGroupF};
const Schema kJoinRequest{"join request", kJoinRequestF};
const Schema kMatchFrame{"match frame", kMatchFrameF};
const Schema kFinReport{"fin report", kFinReportF};
const Schema kRoundFrame{"round frame", kRoundFrameF};
const Schema kStateRequest{"state request", kStateRequestF};
const Schema kStateManifest{"state manifest", kStateManifestF};
const Schema kStateFrame{"state frame", kStateFrameF};
const Schema kStateAnnouncement{"state announcement", kStateAnnouncementF};

}  // namespace starling::averaging::wire::scan
