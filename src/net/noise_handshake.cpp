// Libp2pHandshake: XX with the libp2p rules on top. The initiator sends no payload in message
// 1 (and ignores one it receives there, as it is neither encrypted nor authenticated); message
// 2 carries the responder's signed payload, message 3 the initiator's. The initiator checks the
// responder's identity (and the expected peer id) before it reveals its own in message 3.
#include "net/noise_handshake.hpp"

#include "starling/core/log.hpp"

namespace starling::net::noise {

Libp2pHandshake::Libp2pHandshake(Role role, const crypto::KeyPair& identity, HandshakeConfig config)
    : xx_(role, config.static_key ? *config.static_key : X25519KeyPair::generate(), {},
          std::move(config.ephemeral_key)),
      expected_remote_(std::move(config.expected_remote)) {
  payload_ = encode_handshake_payload(identity, xx_.local_static_public(), config.stream_muxers);
}

result<Bytes> Libp2pHandshake::write_message() {
  if (failed_) return make_error(errc::invalid_argument, "noise handshake already failed");
  // Message 1 has no payload; messages 2 and 3 carry ours.
  auto r = xx_.write_message(xx_.step() == 0 ? BytesView{} : BytesView(payload_));
  if (!r) failed_ = true;
  return r;
}

result<void> Libp2pHandshake::read_message(BytesView message) {
  if (failed_) return make_error(errc::invalid_argument, "noise handshake already failed");
  auto r = read_impl(message);
  if (!r) failed_ = true;
  return r;
}

result<void> Libp2pHandshake::read_impl(BytesView message) {
  int step = xx_.step();
  ST_TRY(auto payload, xx_.read_message(message));
  if (step == 0) {
    if (!payload.empty())
      logger("net")->debug("noise: ignoring {} bytes of payload in handshake message 1",
                           payload.size());
    return success();
  }
  // Messages 2 and 3: the peer's static key is now known and its payload must prove identity.
  auto verified = verify_handshake_payload(payload, *xx_.remote_static());
  if (!verified) return verified.error();
  if (expected_remote_ && verified.value().peer != *expected_remote_)
    return make_error(errc::protocol_violation,
                      "noise: expected peer " + expected_remote_->to_string() +
                          " but the remote proved identity " + verified.value().peer.to_string());
  remote_ = std::move(verified).value();
  return success();
}

result<TransportCiphers> Libp2pHandshake::split() const {
  if (!complete()) return make_error(errc::invalid_argument, "noise handshake is not complete");
  return xx_.split();
}

}  // namespace starling::net::noise
