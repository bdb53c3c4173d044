#include "starling/core/bytes.hpp"

namespace starling {

std::string to_hex(BytesView b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 2);
  for (auto c : b) {
    s.push_back(kDigits[c >> 4]);
    s.push_back(kDigits[c & 15]);
  }
  return s;
}

result<Bytes> from_hex(std::string_view s) {
  if (s.size() % 2) return make_error(errc::invalid_argument, "hex string has odd length");
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  Bytes out(s.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    int hi = nib(s[2 * i]), lo = nib(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return make_error(errc::invalid_argument, "non-hex character");
    out[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return out;
}

void append_uvarint(Bytes& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<std::uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<std::uint8_t>(v));
}

std::size_t uvarint_size(std::uint64_t v) {
  std::size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

result<std::optional<UvarintDecode>> decode_uvarint(BytesView in) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (i >= kMaxUvarintLen)
      return make_error(errc::invalid_argument, "varint longer than 9 bytes");
    std::uint8_t b = in[i];
    v |= static_cast<std::uint64_t>(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) {
      if (i > 0 && b == 0) return make_error(errc::invalid_argument, "non-minimal varint");
      return std::optional<UvarintDecode>(UvarintDecode{v, i + 1});
    }
  }
  if (in.size() >= kMaxUvarintLen)
    return make_error(errc::invalid_argument, "varint longer than 9 bytes");
  return std::optional<UvarintDecode>{};
}

void append_be16(Bytes& out, std::uint16_t v) {
  out.push_back(static_cast<std::uint8_t>(v >> 8));
  out.push_back(static_cast<std::uint8_t>(v));
}
void append_be32(Bytes& out, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(v >> s));
}
void append_be64(Bytes& out, std::uint64_t v) {
  for (int s = 56; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(v >> s));
}
std::uint16_t load_be16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] << 8 | p[1]);
}
std::uint32_t load_be32(const std::uint8_t* p) {
  return std::uint32_t(p[0]) << 24 | std::uint32_t(p[1]) << 16 | std::uint32_t(p[2]) << 8 | p[3];
}
std::uint64_t load_be64(const std::uint8_t* p) {
  return std::uint64_t{load_be32(p)} << 32 | load_be32(p + 4);
}

}  // namespace starling
