// libp2p peer IDs: the multihash of a protobuf-encoded public key (identity multihash when the
// encoding is <= 42 bytes, as for Ed25519: "12D3KooW..."; sha2-256 otherwise: "Qm..."),
// printed in base58btc. Also parses the CIDv1 form (multibase base32 "b..." or base58btc "z...",
// codec libp2p-key). Parse errors are errc::invalid_argument with the reason; callers that got
// the input from a peer log it and map it to their protocol error. Threading: plain values.
#pragma once

#include <algorithm>
#include <array>
#include <compare>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "starling/core/bytes.hpp"
#include "starling/crypto/keys.hpp"

namespace starling::net {

class PeerId {
 public:
  PeerId() = default;  // empty (invalid) id; valid() is false
  static PeerId from_public_key(const crypto::PublicKey& key);
  // From the binary multihash; rejects unknown hash codes, wrong lengths, non-minimal varints.
  static result<PeerId> from_bytes(BytesView multihash);
  // From base58btc ("12D3KooW...", "Qm...") or CIDv1 ("bafz...", "z..."); errors say why.
  static result<PeerId> from_string(std::string_view s);

  std::string to_string() const;  // base58btc
  BytesView bytes() const noexcept { return BytesView(mh_.data(), size_); }
  bool valid() const noexcept { return size_ != 0; }
  // The public key inlined in an identity multihash, if any.
  std::optional<crypto::PublicKey> public_key() const;
  // A short form for logs: "12D3Ko…abcdef".
  std::string short_string() const;

  // Byte-wise lexicographic, as the multihash bytes compare.
  friend std::strong_ordering operator<=>(const PeerId& a, const PeerId& b) noexcept {
    const BytesView x = a.bytes(), y = b.bytes();
    return std::lexicographical_compare_three_way(x.begin(), x.end(), y.begin(), y.end());
  }
  friend bool operator==(const PeerId& a, const PeerId& b) noexcept {
    return a.size_ == b.size_ && a.mh_ == b.mh_;  // bytes past size_ are always zero
  }

  // The longest multihash a peer id can be: an identity multihash of a 42-byte key.
  static constexpr std::size_t kMaxBytes = 44;

 private:
  explicit PeerId(BytesView mh);
  // Inline, so that a copy (peer ids are copied into every map, contact and message) never
  // allocates.
  std::array<std::uint8_t, kMaxBytes> mh_{};
  std::uint8_t size_ = 0;
};

}  // namespace starling::net

template <>
struct std::hash<starling::net::PeerId> {
  std::size_t operator()(const starling::net::PeerId& p) const noexcept;
};
