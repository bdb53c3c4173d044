// libp2p peer IDs: multihash of the public-key protobuf; base58btc and CIDv1 text forms.
#include "starling/net/peer_id.hpp"

#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "starling/core/base58.hpp"

namespace starling::net {
namespace {

constexpr std::uint64_t kIdentityCode = 0x00;
constexpr std::uint64_t kSha256Code = 0x12;
constexpr std::size_t kSha256Size = 32;
constexpr std::size_t kMaxInlineKeySize = 42;  // peer-ids spec: inline keys up to 42 bytes
constexpr std::uint64_t kCidVersion1 = 0x01;
constexpr std::uint64_t kLibp2pKeyCodec = 0x72;
// Longest valid text form: a CIDv1 of a 36-byte multihash is ~64 characters; allow slack.
constexpr std::size_t kMaxTextSize = 128;

Error bad(std::string why) {
  return make_error(errc::invalid_argument, "peer id: " + why);
}

// Reads a varint from `in` at `pos`, advancing `pos`. `what` names the field in errors.
result<std::uint64_t> read_varint(BytesView in, std::size_t& pos, const char* what) {
  auto d = decode_uvarint(in.subspan(pos));
  if (!d) return bad(std::string(what) + ": " + d.error().context());
  if (!d.value()) return bad(std::string("truncated ") + what);
  pos += d.value()->length;
  return d.value()->value;
}

result<PeerId> from_cid_bytes(BytesView cid) {
  std::size_t pos = 0;
  ST_TRY(auto version, read_varint(cid, pos, "CID version"));
  if (version != kCidVersion1) return bad("unsupported CID version " + std::to_string(version));
  ST_TRY(auto codec, read_varint(cid, pos, "CID codec"));
  if (codec != kLibp2pKeyCodec) {
    return bad(fmt::format("CID codec 0x{:x} is not libp2p-key (0x72)", codec));
  }
  return PeerId::from_bytes(cid.subspan(pos));
}

}  // namespace

PeerId PeerId::from_public_key(const crypto::PublicKey& key) {
  Bytes pb = key.to_protobuf();
  Bytes mh;
  if (pb.size() <= kMaxInlineKeySize) {
    mh.reserve(2 + pb.size());
    append_uvarint(mh, kIdentityCode);
    append_uvarint(mh, pb.size());
    mh.insert(mh.end(), pb.begin(), pb.end());
  } else {
    auto digest = crypto::sha256(pb);
    mh.reserve(2 + digest.size());
    append_uvarint(mh, kSha256Code);
    append_uvarint(mh, digest.size());
    mh.insert(mh.end(), digest.begin(), digest.end());
  }
  return PeerId(mh);
}

PeerId::PeerId(BytesView mh) {
  if (mh.size() > kMaxBytes) throw std::length_error("peer id: multihash over 44 bytes");
  std::copy(mh.begin(), mh.end(), mh_.begin());
  size_ = static_cast<std::uint8_t>(mh.size());
}

result<PeerId> PeerId::from_bytes(BytesView multihash) {
  if (multihash.empty()) return bad("empty multihash");
  std::size_t pos = 0;
  ST_TRY(auto code, read_varint(multihash, pos, "multihash code"));
  if (code != kIdentityCode && code != kSha256Code) {
    return bad(fmt::format(
        "unsupported multihash code 0x{:x} (only identity 0x00 and sha2-256 0x12)", code));
  }
  ST_TRY(auto len, read_varint(multihash, pos, "multihash length"));
  std::size_t remaining = multihash.size() - pos;
  if (len != remaining) {
    return bad("multihash length mismatch: header says " + std::to_string(len) + " bytes, " +
               std::to_string(remaining) + " present");
  }
  BytesView digest = multihash.subspan(pos);
  if (code == kIdentityCode) {
    if (len > kMaxInlineKeySize) {
      return bad("identity multihash of " + std::to_string(len) +
                 " bytes (keys over 42 bytes must be hashed with sha2-256)");
    }
    auto key = crypto::PublicKey::from_protobuf(digest);
    if (!key) return key.error().with_context("peer id: identity multihash");
  } else if (len != kSha256Size) {
    return bad("sha2-256 multihash of " + std::to_string(len) + " bytes (must be 32)");
  }
  return PeerId(multihash);
}

result<PeerId> PeerId::from_string(std::string_view s) {
  if (s.empty()) return bad("empty string");
  if (s.size() > kMaxTextSize) {
    return bad("string of " + std::to_string(s.size()) + " characters is too long");
  }
  // Bare base58btc multihashes start with '1' (identity) or "Qm" (sha2-256); anything else is
  // a multibase-prefixed CIDv1 (peer-ids spec, "String representation").
  if (s[0] == '1' || s.starts_with("Qm")) {
    auto mh = base58_decode(s);
    if (!mh) return mh.error().with_context("peer id");
    return from_bytes(mh.value());
  }
  if (s[0] == 'b') {
    auto cid = base32_decode(s.substr(1));
    if (!cid) return cid.error().with_context("peer id CID");
    return from_cid_bytes(cid.value());
  }
  if (s[0] == 'z') {
    auto cid = base58_decode(s.substr(1));
    if (!cid) return cid.error().with_context("peer id CID");
    return from_cid_bytes(cid.value());
  }
  std::string shown(s.substr(0, 16));
  return bad("unrecognised encoding of '" + shown + (s.size() > 16 ? "...'" : "'") +
             " (expected base58btc '1...'/'Qm...' or CIDv1 multibase 'b...'/'z...')");
}

std::string PeerId::to_string() const {
  return base58_encode(bytes());
}

std::optional<crypto::PublicKey> PeerId::public_key() const {
  const BytesView mh = bytes();
  if (mh.size() < 2 || mh[0] != kIdentityCode) return std::nullopt;
  std::size_t pos = 1;
  auto len = read_varint(mh, pos, "multihash length");
  if (!len || len.value() != mh.size() - pos) return std::nullopt;
  auto key = crypto::PublicKey::from_protobuf(mh.subspan(pos));
  if (!key) return std::nullopt;
  return std::move(key).value();
}

std::string PeerId::short_string() const {
  if (!valid()) return "<no peer id>";
  std::string s = to_string();
  if (s.size() <= 16) return s;
  return s.substr(0, 6) + "\u2026" + s.substr(s.size() - 6);
}

}  // namespace starling::net

std::size_t std::hash<starling::net::PeerId>::operator()(
    const starling::net::PeerId& p) const noexcept {
  return std::hash<std::string_view>{}(starling::as_string(p.bytes()));
}
