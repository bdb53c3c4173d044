// libp2p peer IDs: the multihash of a protobuf-encoded public key (identity multihash when the
// encoding is <= 42 bytes, as for Ed25519: "12D3KooW..."; sha2-256 otherwise: "Qm..."),
// printed in base58btc. Also parses the CIDv1 form (multibase base32 "b..." or base58btc "z...",
// codec libp2p-key). Parse errors are errc::invalid_argument with the reason; callers that got
// the input from a peer log it and map it to their protocol error. Threading: plain values.
#pragma once

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
  const Bytes& bytes() const noexcept { return mh_; }
  bool valid() const noexcept { return !mh_.empty(); }
  // The public key inlined in an identity multihash, if any.
  std::optional<crypto::PublicKey> public_key() const;
  // A short form for logs: "12D3Ko…abcdef".
  std::string short_string() const;

  friend auto operator<=>(const PeerId&, const PeerId&) = default;
  friend bool operator==(const PeerId&, const PeerId&) = default;

 private:
  explicit PeerId(Bytes mh) : mh_(std::move(mh)) {}
  Bytes mh_;
};

}  // namespace starling::net

template <>
struct std::hash<starling::net::PeerId> {
  std::size_t operator()(const starling::net::PeerId& p) const noexcept;
};
