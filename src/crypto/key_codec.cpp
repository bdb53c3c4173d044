#include "crypto/key_codec.hpp"

#include <string>

namespace starling::crypto::detail {
namespace {

constexpr std::uint8_t kTypeTag = 0x08;  // field 1, wire type 0 (varint)
constexpr std::uint8_t kDataTag = 0x12;  // field 2, wire type 2 (length-delimited)

Error bad(const char* what, const std::string& why) {
  return make_error(errc::invalid_argument, std::string(what) + " protobuf: " + why);
}

// Describes an unexpected tag byte sequence at the start of `in` for error messages.
std::string describe_tag(BytesView in) {
  auto tag = decode_uvarint(in);
  if (!tag || !tag.value()) return "malformed field tag";
  std::uint64_t v = tag.value()->value;
  return "unexpected field " + std::to_string(v >> 3) + " with wire type " + std::to_string(v & 7);
}

}  // namespace

Bytes encode_key_message(KeyType type, BytesView data) {
  Bytes out;
  out.reserve(2 + kMaxUvarintLen * 2 + data.size());
  out.push_back(kTypeTag);
  append_uvarint(out, static_cast<std::uint64_t>(type));
  out.push_back(kDataTag);
  append_uvarint(out, data.size());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

result<KeyMessage> decode_key_message(BytesView pb, const char* what) {
  if (pb.empty()) return bad(what, "empty message (missing Type field)");
  if (pb[0] != kTypeTag) {
    if (pb[0] == kDataTag) return bad(what, "Data field before Type field (non-canonical)");
    return bad(what, describe_tag(pb) + " (expected Type)");
  }
  auto type = decode_uvarint(pb.subspan(1));
  if (!type) return bad(what, "Type: " + type.error().context());
  if (!type.value()) return bad(what, "truncated Type field");
  std::uint64_t type_value = type.value()->value;
  if (type_value > static_cast<std::uint64_t>(KeyType::ecdsa)) {
    return bad(what, "unknown key type " + std::to_string(type_value));
  }
  std::size_t pos = 1 + type.value()->length;
  if (pos == pb.size()) return bad(what, "missing Data field");
  if (pb[pos] != kDataTag) {
    if (pb[pos] == kTypeTag) return bad(what, "duplicate Type field");
    return bad(what, describe_tag(pb.subspan(pos)) + " (expected Data)");
  }
  ++pos;
  auto len = decode_uvarint(pb.subspan(pos));
  if (!len) return bad(what, "Data length: " + len.error().context());
  if (!len.value()) return bad(what, "truncated Data length");
  pos += len.value()->length;
  std::uint64_t n = len.value()->value;
  if (n > kMaxKeyDataSize) {
    return make_error(errc::too_large, std::string(what) + " protobuf: Data field of " +
                                           std::to_string(n) + " bytes exceeds " +
                                           std::to_string(kMaxKeyDataSize));
  }
  if (n > pb.size() - pos) {
    return bad(what, "Data field truncated (" + std::to_string(n) + " bytes declared, " +
                         std::to_string(pb.size() - pos) + " present)");
  }
  KeyMessage msg{static_cast<KeyType>(type_value), pb.subspan(pos, static_cast<std::size_t>(n))};
  pos += static_cast<std::size_t>(n);
  if (pos != pb.size()) {
    return bad(what, std::to_string(pb.size() - pos) +
                         " trailing bytes after Data field (unknown or duplicate fields)");
  }
  return msg;
}

}  // namespace starling::crypto::detail
