// DHT identifiers: 256-bit ids in the Kademlia XOR metric (node id = SHA-256 of the binary
// peer id, key id = SHA-256 of the user's key bytes), the user's record key and sub-key as
// strong types, and the small value types the protocol core passes around (Contact, Now,
// request and operation ids).
//
// Threading rule: plain values; no shared state.
#pragma once

#include <array>
#include <chrono>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "starling/core/clock.hpp"

#include "starling/core/bytes.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::dht {

// A point in the 256-bit id space (also used for XOR distances). Bits are numbered from the
// most significant bit of byte 0.
class DhtId {
 public:
  static constexpr std::size_t kBytes = 32;
  static constexpr std::size_t kBits = 256;
  using Array = std::array<std::uint8_t, kBytes>;

  DhtId() = default;  // all zero
  explicit DhtId(const Array& a) : v_(a) {}

  // SHA-256 of `data`.
  static DhtId hash_of(BytesView data);
  // The node id of a peer: SHA-256 of its binary peer id (multihash).
  static DhtId of_peer(const net::PeerId& peer);
  // Exactly 32 bytes, else errc::invalid_argument.
  static result<DhtId> from_bytes(BytesView b);
  static DhtId random(std::mt19937_64& rng);
  // A random id whose first `depth` bits equal those of `prefix`.
  static DhtId random_with_prefix(const DhtId& prefix, std::size_t depth, std::mt19937_64& rng);

  const Array& array() const noexcept { return v_; }
  BytesView bytes() const noexcept { return {v_.data(), v_.size()}; }
  bool bit(std::size_t i) const noexcept { return (v_[i / 8] >> (7 - i % 8)) & 1; }
  // Returns a copy with bit i set to `value`.
  DhtId with_bit(std::size_t i, bool value) const noexcept;
  // Keeps the first `depth` bits, zeroes the rest.
  DhtId masked(std::size_t depth) const noexcept;
  // Number of leading bits shared with `o` (256 if equal).
  std::size_t common_prefix_length(const DhtId& o) const noexcept;
  // Position of the most significant set bit counted from the top (256 for zero).
  std::size_t leading_zeros() const noexcept;

  DhtId operator^(const DhtId& o) const noexcept {
    DhtId r;
    for (std::size_t i = 0; i < kBytes; ++i) r.v_[i] = v_[i] ^ o.v_[i];
    return r;
  }
  std::string to_hex() const;
  std::string short_hex() const;  // first 8 hex digits, for logs

  // Numeric order of the 256-bit big-endian value (compared 64 bits at a time).
  friend std::strong_ordering operator<=>(const DhtId& a, const DhtId& b) noexcept {
    for (std::size_t i = 0; i < kBytes; i += 8) {
      const std::uint64_t x = a.word(i), y = b.word(i);
      if (x != y) return x < y ? std::strong_ordering::less : std::strong_ordering::greater;
    }
    return std::strong_ordering::equal;
  }
  friend bool operator==(const DhtId&, const DhtId&) = default;

 private:
  std::uint64_t word(std::size_t i) const noexcept {  // big-endian 8 bytes at offset i
    std::uint64_t w = 0;
    for (std::size_t j = 0; j < 8; ++j) w = (w << 8) | v_[i + j];
    return w;
  }
  Array v_{};
};

// True iff `a` is strictly closer to `target` than `b` in the XOR metric.
inline bool closer(const DhtId& target, const DhtId& a, const DhtId& b) noexcept {
  return (a ^ target) < (b ^ target);
}

// The key a user stores under (arbitrary bytes) and its id in the DHT.
class RecordKey {
 public:
  RecordKey() = default;
  explicit RecordKey(Bytes raw);
  static RecordKey from_string(std::string_view s) { return RecordKey(to_bytes(s)); }

  const Bytes& raw() const noexcept { return raw_; }
  const DhtId& id() const noexcept { return id_; }
  // Printable form for logs (the bytes if printable ASCII, else hex), shortened.
  std::string to_string() const;

  friend bool operator==(const RecordKey& a, const RecordKey& b) { return a.raw_ == b.raw_; }

 private:
  Bytes raw_;
  DhtId id_ = DhtId::hash_of({});
};

// A sub-key inside a dictionary value (arbitrary bytes, ordered bytewise).
class SubKey {
 public:
  SubKey() = default;
  explicit SubKey(Bytes raw) : raw_(std::move(raw)) {}
  static SubKey from_string(std::string_view s) { return SubKey(to_bytes(s)); }
  const Bytes& raw() const noexcept { return raw_; }
  std::string to_string() const;

  friend auto operator<=>(const SubKey&, const SubKey&) = default;
  friend bool operator==(const SubKey&, const SubKey&) = default;

 private:
  Bytes raw_;
};

// Printable form of arbitrary bytes for log lines (ASCII if printable, else hex; truncated).
std::string printable(BytesView b, std::size_t max_len = 48);

using starling::Millis;
using starling::WallClock;
using starling::WallTime;

// The time passed to every call of the protocol core: a monotonic clock for deadlines and
// the local wall clock (only for record versions and the coarse signature window).
struct Now {
  TimePoint mono;
  WallTime wall;
  static Now from_clocks() { return {Clock::now(), WallClock::now()}; }
};

// Microseconds since the Unix epoch of a wall time (the unit of record versions).
inline std::int64_t wall_micros(WallTime t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

// A node we can send requests to: its peer id, DHT id (derived from the peer id) and the
// addresses it announced (binary multiaddrs; opaque to the core).
struct Contact {
  net::PeerId peer;
  DhtId id;
  std::vector<Bytes> addrs;

  static Contact of(net::PeerId peer, std::vector<Bytes> addrs = {}) {
    DhtId id = DhtId::of_peer(peer);
    return {std::move(peer), id, std::move(addrs)};
  }
};

enum class RequestId : std::uint64_t {};
enum class OpId : std::uint64_t {};

}  // namespace starling::dht

template <>
struct std::hash<starling::dht::DhtId> {
  std::size_t operator()(const starling::dht::DhtId& id) const noexcept {
    std::size_t h = 0;
    for (std::size_t i = 0; i < sizeof(std::size_t); ++i) h = (h << 8) | id.array()[i];
    return h;
  }
};
