// HandshakeState for Noise_XX_25519_ChaChaPoly_SHA256 (Noise Protocol Framework section 5.3):
//   -> e
//   <- e, ee, s, es
//   -> s, se
// No I/O: messages go in and out as byte vectors.
#include <cstring>

#include "net/noise_handshake.hpp"

namespace starling::net::noise {

namespace {

// Bytes each message carries besides the payload (its tag included where there is a key).
constexpr std::size_t kOverhead[3] = {
    kDhLen,                                 // e
    kDhLen + (kDhLen + kTagLen) + kTagLen,  // e, encrypted s, payload tag
    (kDhLen + kTagLen) + kTagLen,           // encrypted s, payload tag
};

Key to_key(BytesView b) {
  Key k;
  std::memcpy(k.data(), b.data(), k.size());
  return k;
}

}  // namespace

XXHandshake::XXHandshake(Role role, X25519KeyPair static_key, BytesView prologue,
                         std::optional<X25519KeyPair> ephemeral)
    : role_(role), ss_(kProtocolName), s_(static_key), preset_e_(std::move(ephemeral)) {
  ss_.mix_hash(prologue);  // an empty prologue is still hashed
}

bool XXHandshake::is_my_turn() const noexcept {
  if (failed_ || step_ >= 3) return false;
  bool initiator_sends = step_ != 1;
  return (role_ == Role::initiator) == initiator_sends;
}

result<void> XXHandshake::mix_dh(const Key& secret, const Key& remote) {
  ST_TRY(auto shared, x25519(secret, remote));
  ss_.mix_key(shared);
  return success();
}

result<Bytes> XXHandshake::write_message(BytesView payload) {
  if (failed_) return make_error(errc::invalid_argument, "noise handshake already failed");
  if (!is_my_turn())
    return make_error(errc::invalid_argument, "noise handshake: not our turn to write (message " +
                                                  std::to_string(step_ + 1) + ")");
  if (payload.size() + kOverhead[step_] > kMaxMessage)
    return make_error(errc::too_large, "noise handshake payload of " +
                                           std::to_string(payload.size()) + " bytes is too large");
  auto r = write_impl(payload);
  if (!r) failed_ = true;
  return r;
}

result<Bytes> XXHandshake::write_impl(BytesView payload) {
  Bytes out;
  out.reserve(kOverhead[step_] + payload.size());
  if (step_ == 0 || step_ == 1) {  // e
    e_ = preset_e_ ? *preset_e_ : X25519KeyPair::generate();
    out.insert(out.end(), e_->public_key.begin(), e_->public_key.end());
    ss_.mix_hash(e_->public_key);
  }
  if (step_ == 1) {
    ST_TRY(mix_dh(e_->secret, *re_));                  // ee
    ST_TRY(ss_.encrypt_and_hash(s_.public_key, out));  // s
    ST_TRY(mix_dh(s_.secret, *re_));                   // es (responder side)
  } else if (step_ == 2) {
    ST_TRY(ss_.encrypt_and_hash(s_.public_key, out));  // s
    ST_TRY(mix_dh(s_.secret, *re_));                   // se (initiator side)
  }
  ST_TRY(ss_.encrypt_and_hash(payload, out));
  ++step_;
  return out;
}

result<Bytes> XXHandshake::read_message(BytesView message) {
  if (failed_) return make_error(errc::invalid_argument, "noise handshake already failed");
  if (step_ >= 3 || is_my_turn())
    return make_error(errc::protocol_violation,
                      "noise handshake: unexpected message from the peer");
  if (message.size() > kMaxMessage) {
    failed_ = true;
    return make_error(errc::too_large,
                      "noise handshake message of " + std::to_string(message.size()) + " bytes");
  }
  if (message.size() < kOverhead[step_]) {
    failed_ = true;
    return make_error(errc::protocol_violation,
                      "noise handshake message " + std::to_string(step_ + 1) + " truncated (" +
                          std::to_string(message.size()) + " bytes, need at least " +
                          std::to_string(kOverhead[step_]) + ")");
  }
  auto r = read_impl(message);
  if (!r) {
    failed_ = true;
    return r.error().with_context("noise handshake message " + std::to_string(step_ + 1));
  }
  return r;
}

result<Bytes> XXHandshake::read_impl(BytesView message) {
  // Nothing learned from the message (re, rs) is kept unless all of it authenticates.
  std::size_t pos = 0;
  std::optional<Key> re = re_, rs;
  if (step_ == 0 || step_ == 1) {  // e
    re = to_key(message.subspan(0, kDhLen));
    ss_.mix_hash(*re);
    pos = kDhLen;
  }
  if (step_ == 1 || step_ == 2) {
    if (step_ == 1) {
      ST_TRY(mix_dh(e_->secret, *re));  // ee
    }
    ST_TRY(auto s, ss_.decrypt_and_hash(message.subspan(pos, kDhLen + kTagLen)));  // s
    pos += kDhLen + kTagLen;
    rs = to_key(s);
    ST_TRY(mix_dh(e_->secret, *rs));  // es (initiator side) or se (responder side)
  }
  ST_TRY(auto payload, ss_.decrypt_and_hash(message.subspan(pos)));
  re_ = re;
  if (rs) rs_ = rs;
  ++step_;
  return payload;
}

result<TransportCiphers> XXHandshake::split() const {
  if (!complete()) return make_error(errc::invalid_argument, "noise handshake is not complete");
  auto [i2r, r2i] = ss_.split();
  TransportCiphers out;
  out.send = role_ == Role::initiator ? i2r : r2i;
  out.recv = role_ == Role::initiator ? r2i : i2r;
  out.handshake_hash = ss_.handshake_hash();
  return out;
}

}  // namespace starling::net::noise
