// base58btc (Bitcoin alphabet) and RFC 4648 base32 (lower case, unpadded, as multibase 'b').
#include "starling/core/base58.hpp"

#include <array>
#include <string>

namespace starling {
namespace {

constexpr char kB58Alphabet[] = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";
constexpr char kB32Alphabet[] = "abcdefghijklmnopqrstuvwxyz234567";

// Reverse lookup table: character -> digit, or -1.
template <std::size_t N>
constexpr std::array<std::int8_t, 256> make_reverse(const char (&alphabet)[N]) {
  std::array<std::int8_t, 256> t{};
  for (auto& v : t) v = -1;
  for (std::size_t i = 0; i + 1 < N; ++i) {
    t[static_cast<unsigned char>(alphabet[i])] = static_cast<std::int8_t>(i);
  }
  return t;
}
constexpr auto kB58Reverse = make_reverse(kB58Alphabet);
constexpr auto kB32Reverse = make_reverse(kB32Alphabet);

std::string describe_char(char c, std::size_t pos) {
  auto u = static_cast<unsigned char>(c);
  std::string what =
      (u >= 0x20 && u < 0x7f) ? std::string("'") + c + "'" : "byte 0x" + to_hex(BytesView(&u, 1));
  return what + " at position " + std::to_string(pos);
}

}  // namespace

std::string base58_encode(BytesView data) {
  std::size_t zeros = 0;
  while (zeros < data.size() && data[zeros] == 0) ++zeros;
  // Big-number conversion base 256 -> base 58, digits stored little-endian.
  std::vector<std::uint8_t> digits;
  digits.reserve((data.size() - zeros) * 138 / 100 + 1);
  for (std::size_t i = zeros; i < data.size(); ++i) {
    std::uint32_t carry = data[i];
    for (auto& d : digits) {
      carry += static_cast<std::uint32_t>(d) << 8;
      d = static_cast<std::uint8_t>(carry % 58);
      carry /= 58;
    }
    while (carry > 0) {
      digits.push_back(static_cast<std::uint8_t>(carry % 58));
      carry /= 58;
    }
  }
  std::string out(zeros, '1');
  out.reserve(zeros + digits.size());
  for (auto it = digits.rbegin(); it != digits.rend(); ++it) out.push_back(kB58Alphabet[*it]);
  return out;
}

result<Bytes> base58_decode(std::string_view s) {
  std::size_t ones = 0;
  while (ones < s.size() && s[ones] == '1') ++ones;
  // Big-number conversion base 58 -> base 256, bytes stored little-endian.
  std::vector<std::uint8_t> bytes;
  bytes.reserve((s.size() - ones) * 733 / 1000 + 1);
  for (std::size_t i = ones; i < s.size(); ++i) {
    int v = kB58Reverse[static_cast<unsigned char>(s[i])];
    if (v < 0) {
      return make_error(errc::invalid_argument,
                        "invalid base58 character " + describe_char(s[i], i));
    }
    std::uint32_t carry = static_cast<std::uint32_t>(v);
    for (auto& b : bytes) {
      carry += static_cast<std::uint32_t>(b) * 58;
      b = static_cast<std::uint8_t>(carry & 0xff);
      carry >>= 8;
    }
    while (carry > 0) {
      bytes.push_back(static_cast<std::uint8_t>(carry & 0xff));
      carry >>= 8;
    }
  }
  Bytes out(ones, 0);
  out.insert(out.end(), bytes.rbegin(), bytes.rend());
  return out;
}

std::string base32_encode(BytesView data) {
  std::string out;
  out.reserve((data.size() * 8 + 4) / 5);
  std::uint32_t buffer = 0;
  int bits = 0;
  for (auto b : data) {
    buffer = (buffer << 8) | b;
    bits += 8;
    while (bits >= 5) {
      bits -= 5;
      out.push_back(kB32Alphabet[(buffer >> bits) & 31]);
    }
    buffer &= (1u << bits) - 1;
  }
  if (bits > 0) out.push_back(kB32Alphabet[(buffer << (5 - bits)) & 31]);
  return out;
}

result<Bytes> base32_decode(std::string_view s) {
  // Unpadded RFC 4648: a final group of 1, 3 or 6 characters cannot come from whole bytes.
  switch (s.size() % 8) {
    case 1:
    case 3:
    case 6:
      return make_error(errc::invalid_argument,
                        "invalid base32 length " + std::to_string(s.size()));
    default:
      break;
  }
  Bytes out;
  out.reserve(s.size() * 5 / 8);
  std::uint32_t buffer = 0;
  int bits = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    int v = kB32Reverse[static_cast<unsigned char>(s[i])];
    if (v < 0) {
      return make_error(errc::invalid_argument,
                        "invalid base32 character " + describe_char(s[i], i));
    }
    buffer = (buffer << 5) | static_cast<std::uint32_t>(v);
    bits += 5;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<std::uint8_t>(buffer >> bits));
      buffer &= (1u << bits) - 1;
    }
  }
  // Leftover bits must be zero, so every byte string has exactly one encoding.
  if (buffer != 0) return make_error(errc::invalid_argument, "non-zero trailing bits in base32");
  return out;
}

}  // namespace starling
