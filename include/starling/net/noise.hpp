// libp2p Noise security (multistream protocol id "/noise"): the Noise_XX_25519_ChaChaPoly_SHA256
// handshake with the libp2p handshake payload (identity key + signature over the static X25519
// key), then an encrypted ByteStream of 2-byte-length-prefixed ChaChaPoly frames.
//
// Spec: libp2p/specs noise/README.md and the Noise Protocol Framework (rev 34).
// Threading rule: call from coroutines on `raw`'s executor; the returned stream belongs to the
// same executor and, like a socket, allows one read and one write outstanding at a time.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "starling/core/async.hpp"
#include "starling/crypto/keys.hpp"
#include "starling/net/byte_stream.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::net {

// An authenticated, encrypted channel. `stream` reads and writes plaintext.
struct SecureChannel {
  ByteStreamPtr stream;
  PeerId remote_peer;
  crypto::PublicKey remote_key;
  // Stream muxers the remote advertised in the handshake's NoiseExtensions (usually empty;
  // Starling itself does not advertise any, so muxers are negotiated with multistream-select).
  std::vector<std::string> remote_stream_muxers;
};

// Runs the handshake as initiator (dialer). With `expected_remote` set, fails with
// errc::protocol_violation (naming both ids) if the responder proves a different identity.
// Every failure (bad signature or payload, decryption failure, oversize or truncated message,
// timeout after `timeout`) resets `raw` and returns an error whose context says why.
awaitable<result<SecureChannel>> noise_secure_outbound(ByteStreamPtr raw,
                                                       const crypto::KeyPair& identity,
                                                       std::optional<PeerId> expected_remote,
                                                       Duration timeout);

// Runs the handshake as responder (listener). Same failure rules as noise_secure_outbound.
awaitable<result<SecureChannel>> noise_secure_inbound(ByteStreamPtr raw,
                                                      const crypto::KeyPair& identity,
                                                      Duration timeout);

}  // namespace starling::net
