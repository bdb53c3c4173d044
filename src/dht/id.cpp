#include "starling/dht/id.hpp"

#include <bit>

#include "starling/crypto/keys.hpp"

namespace starling::dht {

DhtId DhtId::hash_of(BytesView data) {
  return DhtId(crypto::sha256(data));
}

DhtId DhtId::of_peer(const net::PeerId& peer) {
  return hash_of(peer.bytes());
}

result<DhtId> DhtId::from_bytes(BytesView b) {
  if (b.size() != kBytes)
    return make_error(errc::invalid_argument,
                      "dht id must be 32 bytes, got " + std::to_string(b.size()));
  Array a;
  std::copy(b.begin(), b.end(), a.begin());
  return DhtId(a);
}

DhtId DhtId::random(std::mt19937_64& rng) {
  Array a;
  for (std::size_t i = 0; i < kBytes; i += 8) {
    std::uint64_t r = rng();
    for (std::size_t j = 0; j < 8; ++j) a[i + j] = static_cast<std::uint8_t>(r >> (8 * j));
  }
  return DhtId(a);
}

DhtId DhtId::random_with_prefix(const DhtId& prefix, std::size_t depth, std::mt19937_64& rng) {
  if (depth > kBits) depth = kBits;
  DhtId r = random(rng);
  for (std::size_t i = 0; i < depth / 8; ++i) r.v_[i] = prefix.v_[i];
  if (depth % 8) {
    const std::size_t i = depth / 8;
    const auto mask = static_cast<std::uint8_t>(0xff << (8 - depth % 8));
    r.v_[i] = static_cast<std::uint8_t>((prefix.v_[i] & mask) | (r.v_[i] & ~mask));
  }
  return r;
}

DhtId DhtId::with_bit(std::size_t i, bool value) const noexcept {
  DhtId r = *this;
  const auto m = static_cast<std::uint8_t>(1u << (7 - i % 8));
  if (value)
    r.v_[i / 8] |= m;
  else
    r.v_[i / 8] &= static_cast<std::uint8_t>(~m);
  return r;
}

DhtId DhtId::masked(std::size_t depth) const noexcept {
  DhtId r;
  if (depth > kBits) depth = kBits;
  for (std::size_t i = 0; i < depth / 8; ++i) r.v_[i] = v_[i];
  if (depth % 8) {
    const std::size_t i = depth / 8;
    r.v_[i] = static_cast<std::uint8_t>(v_[i] & (0xff << (8 - depth % 8)));
  }
  return r;
}

std::size_t DhtId::common_prefix_length(const DhtId& o) const noexcept {
  return (*this ^ o).leading_zeros();
}

std::size_t DhtId::leading_zeros() const noexcept {
  for (std::size_t i = 0; i < kBytes; ++i)
    if (v_[i]) return i * 8 + static_cast<std::size_t>(std::countl_zero(v_[i]));
  return kBits;
}

std::string DhtId::to_hex() const {
  return starling::to_hex(bytes());
}
std::string DhtId::short_hex() const {
  return starling::to_hex(bytes().first(4));
}

RecordKey::RecordKey(Bytes raw) : raw_(std::move(raw)), id_(DhtId::hash_of(raw_)) {}

std::string RecordKey::to_string() const {
  return printable(raw_);
}
std::string SubKey::to_string() const {
  return printable(raw_);
}

std::string printable(BytesView b, std::size_t max_len) {
  bool ascii = true;
  for (auto c : b)
    if (c < 0x20 || c > 0x7e) ascii = false;
  if (ascii) {
    std::string s(as_string(b.first(std::min(b.size(), max_len))));
    if (b.size() > max_len) s += "...";
    return "\"" + s + "\"";
  }
  std::string s = starling::to_hex(b.first(std::min(b.size(), max_len / 2)));
  if (b.size() > max_len / 2) s += "...";
  return "0x" + s;
}

}  // namespace starling::dht
