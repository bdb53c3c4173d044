// Private: the two-field libp2p key protobuf (KeyType Type = 1; bytes Data = 2) shared by the
// PublicKey and PrivateKey messages. Encoding is canonical (field 1 then field 2, minimal
// varints); decoding accepts exactly that form. Pure functions, any thread.
#pragma once

#include <cstdint>

#include "starling/core/bytes.hpp"
#include "starling/crypto/keys.hpp"

namespace starling::crypto::detail {

// Upper bound for the Data field (RSA-8192 PKIX DER is ~1.1 KiB).
constexpr std::size_t kMaxKeyDataSize = 4096;

struct KeyMessage {
  KeyType type;
  BytesView data;  // points into the parsed buffer
};

Bytes encode_key_message(KeyType type, BytesView data);
// `what` names the message in errors ("public key", "private key").
result<KeyMessage> decode_key_message(BytesView pb, const char* what);

}  // namespace starling::crypto::detail
