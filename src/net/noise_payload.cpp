// The libp2p Noise handshake payload: building our signed NoiseHandshakePayload and verifying
// the peer's (identity key decodes, its signature covers the static key the handshake proved).
#include "starling/pb/noise.pb.h"

#include "net/noise_handshake.hpp"

namespace starling::net::noise {

Bytes static_key_signing_message(const Key& static_public) {
  Bytes msg = to_bytes(kStaticKeySigPrefix);
  msg.insert(msg.end(), static_public.begin(), static_public.end());
  return msg;
}

Bytes encode_handshake_payload(const crypto::KeyPair& identity, const Key& static_public,
                               const std::vector<std::string>& stream_muxers) {
  pb::noise::NoiseHandshakePayload pb;
  Bytes key = identity.public_key().to_protobuf();
  Bytes sig = identity.sign(static_key_signing_message(static_public));
  pb.set_identity_key(key.data(), key.size());
  pb.set_identity_sig(sig.data(), sig.size());
  if (!stream_muxers.empty()) {
    auto* ext = pb.mutable_extensions();
    for (const auto& m : stream_muxers) ext->add_stream_muxers(m);
  }
  Bytes out(pb.ByteSizeLong());
  pb.SerializeWithCachedSizesToArray(out.data());
  return out;
}

result<VerifiedPeer> verify_handshake_payload(BytesView payload, const Key& remote_static) {
  pb::noise::NoiseHandshakePayload pb;
  if (payload.size() > kMaxMessage ||
      !pb.ParseFromArray(payload.data(), static_cast<int>(payload.size())))
    return make_error(errc::protocol_violation, "malformed noise handshake payload (protobuf)");
  if (!pb.has_identity_key() || pb.identity_key().empty())
    return make_error(errc::protocol_violation, "noise handshake payload has no identity key");
  if (!pb.has_identity_sig() || pb.identity_sig().empty())
    return make_error(errc::protocol_violation,
                      "noise handshake payload has no identity signature");
  auto key = crypto::PublicKey::from_protobuf(as_bytes(pb.identity_key()));
  if (!key)
    return make_error(errc::protocol_violation,
                      "noise handshake payload: bad identity key: " + key.error().message());
  if (key.value().type() != crypto::KeyType::ed25519)
    return make_error(errc::protocol_violation,
                      "noise handshake payload: identity key type " +
                          std::to_string(static_cast<int>(key.value().type())) +
                          " is not supported (only Ed25519)");
  if (!key.value().verify(static_key_signing_message(remote_static), as_bytes(pb.identity_sig())))
    return make_error(errc::protocol_violation,
                      "noise handshake payload: identity signature does not cover the static "
                      "key");
  VerifiedPeer out;
  out.key = std::move(key).value();
  out.peer = PeerId::from_public_key(out.key);
  if (pb.has_extensions())
    for (const auto& m : pb.extensions().stream_muxers()) out.stream_muxers.push_back(m);
  return out;
}

}  // namespace starling::net::noise
