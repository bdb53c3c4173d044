// Shared value types of the averaging layer: peer keys, bit sets over group members or parts,
// and the description of a formed group (members in group order with their declared
// bandwidth, client flag and weight).
//
// Threading rule: plain values, no shared state; safe to copy between threads.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "starling/core/bytes.hpp"
#include "starling/core/result.hpp"

namespace starling::averaging {

// A peer's identity inside the averaging cores: the binary peer id (multihash bytes). The
// networked layer converts to/from net::PeerId; the cores only compare and hash it.
class PeerKey {
 public:
  PeerKey() = default;
  explicit PeerKey(Bytes b) : bytes_(std::move(b)) {}
  explicit PeerKey(BytesView b) : bytes_(b.begin(), b.end()) {}
  static PeerKey from_string(std::string_view s) { return PeerKey(to_bytes(s)); }
  const Bytes& bytes() const noexcept { return bytes_; }
  bool empty() const noexcept { return bytes_.empty(); }
  std::string short_hex() const;  // first 6 bytes in hex, for logs
  friend auto operator<=>(const PeerKey&, const PeerKey&) = default;
  friend bool operator==(const PeerKey&, const PeerKey&) = default;

 private:
  Bytes bytes_;
};

// A fixed-size set of small indices (group members or parts), packed in 64-bit words.
class Bitset {
 public:
  Bitset() = default;
  explicit Bitset(std::size_t n, bool value = false);
  std::size_t size() const noexcept { return n_; }
  bool test(std::size_t i) const noexcept {
    return i < n_ && ((words_[i / 64] >> (i % 64)) & 1u) != 0;
  }
  void set(std::size_t i, bool v = true);
  void reset(std::size_t i) { set(i, false); }
  std::size_t count() const noexcept;
  bool none() const noexcept { return count() == 0; }
  bool all() const noexcept { return count() == n_; }
  // Set operations require equal sizes (checked; mismatch is a broken invariant).
  Bitset& operator|=(const Bitset& o);
  Bitset& operator&=(const Bitset& o);
  Bitset operator~() const;
  friend bool operator==(const Bitset&, const Bitset&) = default;
  std::vector<std::uint32_t> indices() const;
  std::string to_string() const;  // "{0,3,5}"

  // Wire form: ceil(n/8) bytes, bit i in byte i/8 at position i%8. decode() rejects a wrong
  // length or bits set beyond n.
  Bytes encode() const;
  static result<Bitset> decode(BytesView b, std::size_t n);

 private:
  std::size_t n_ = 0;
  std::vector<std::uint64_t> words_;
};

// What a member declared when it joined: enough for every member to compute the same
// partition and the same weighted mean.
struct MemberInfo {
  PeerKey peer;
  std::vector<std::string> addrs;  // multiaddr strings where the member can be dialled
  std::uint64_t bandwidth = 0;     // declared bandwidth, bytes/s (>= 1)
  bool client = false;             // client mode: sends and receives, owns no share
  double weight = 1.0;             // contribution weight (e.g. samples), finite and >= 0
  friend bool operator==(const MemberInfo&, const MemberInfo&) = default;
};

// A formed group, identical on every member (the leader's Start message).
struct GroupInfo {
  Bytes group_id;                   // random, chosen by the leader
  std::vector<MemberInfo> members;  // group order: ranks are indices into this vector
  Bytes schema_hash;
  std::optional<std::size_t> index_of(const PeerKey& p) const;
};

// Checks a member list: non-empty, at most kMaxGroupSize, unique peers, bandwidth >= 1,
// finite non-negative weights, at least one non-client member.
inline constexpr std::size_t kMaxGroupSize = 256;
result<void> validate_members(const std::vector<MemberInfo>& members);

}  // namespace starling::averaging
