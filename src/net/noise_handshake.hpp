// Private to net/: the Noise machinery under include/starling/net/noise.hpp, as pure code that
// does no I/O (so it can be unit-tested against published vectors and fuzzed):
//   - CipherState / SymmetricState: ChaChaPoly (IETF, nonce = 4 zero bytes || LE64 counter),
//     SHA-256, HKDF over HMAC-SHA256, as in the Noise Protocol Framework sections 5.1 and 5.2;
//   - XXHandshake: the HandshakeState for Noise_XX_25519_ChaChaPoly_SHA256 (section 5.3);
//   - the libp2p handshake payload (NoiseHandshakePayload protobuf) and its verification;
//   - Libp2pHandshake: XX plus the libp2p payload rules (payload in messages 2 and 3 only).
// Threading rule: plain values with no shared state; use each object from one thread.
// Errors: a peer's bad input gives errc::protocol_violation / invalid_argument / too_large with
// a context naming the cause; after any error an XXHandshake stays failed.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "starling/core/bytes.hpp"
#include "starling/crypto/keys.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::net::noise {

inline constexpr std::size_t kDhLen = 32;
inline constexpr std::size_t kHashLen = 32;
inline constexpr std::size_t kTagLen = 16;
// A Noise message (handshake or transport, tag included) is at most 65535 bytes, which is also
// the most the 2-byte big-endian length prefix of the libp2p wire format can express.
inline constexpr std::size_t kMaxMessage = 65535;
inline constexpr std::size_t kMaxPlaintext = kMaxMessage - kTagLen;  // 65519
inline constexpr std::string_view kProtocolName = "Noise_XX_25519_ChaChaPoly_SHA256";
// Prefix of what the identity key signs: this string followed by the static X25519 public key.
inline constexpr std::string_view kStaticKeySigPrefix = "noise-libp2p-static-key:";

using Key = std::array<std::uint8_t, 32>;
using Hash = std::array<std::uint8_t, kHashLen>;

struct X25519KeyPair {
  Key secret{};
  Key public_key{};
  X25519KeyPair() = default;
  X25519KeyPair(const X25519KeyPair&) = default;
  X25519KeyPair& operator=(const X25519KeyPair&) = default;
  ~X25519KeyPair();  // wipes the secret
  static X25519KeyPair generate();
  // From a 32-byte private scalar (clamped by X25519 itself, as in RFC 7748).
  static result<X25519KeyPair> from_secret(BytesView secret);
};

// DH(secret, remote): errc::protocol_violation if `remote` is not 32 bytes or the shared
// secret is all zeros (a low-order point).
result<Key> x25519(const Key& secret, BytesView remote_public);

// HKDF of the Noise spec (section 4.3) with HMAC-SHA256, two outputs.
std::pair<Hash, Hash> hkdf2(const Hash& chaining_key, BytesView input_key_material);

class CipherState {
 public:
  CipherState() = default;
  explicit CipherState(const Key& k) { init_key(k); }
  CipherState(const CipherState&) = default;
  CipherState& operator=(const CipherState&) = default;
  ~CipherState();  // wipes the key

  void init_key(const Key& k) noexcept;
  bool has_key() const noexcept { return has_key_; }
  std::uint64_t nonce() const noexcept { return n_; }
  void set_nonce(std::uint64_t n) noexcept { n_ = n; }

  // EncryptWithAd / DecryptWithAd: without a key they pass the text through. The nonce
  // advances only on success; 2^64-1 is reserved (errc::protocol_violation when reached).
  // encrypt_with_ad appends to `out`.
  result<void> encrypt_with_ad(BytesView ad, BytesView plaintext, Bytes& out);
  result<Bytes> decrypt_with_ad(BytesView ad, BytesView ciphertext);

  // Transport fast path (empty ad, key required): seal writes n + kTagLen bytes to `out`
  // (`out` may equal `in`); open decrypts `len` bytes (tag included) to `out` (may equal
  // `in`), producing len - kTagLen bytes.
  result<void> seal(const std::uint8_t* in, std::size_t n, std::uint8_t* out);
  result<void> open(const std::uint8_t* in, std::size_t len, std::uint8_t* out);

 private:
  result<void> check_nonce() const;
  Key k_{};
  bool has_key_ = false;
  std::uint64_t n_ = 0;
};

class SymmetricState {
 public:
  explicit SymmetricState(std::string_view protocol_name);
  SymmetricState(const SymmetricState&) = default;
  SymmetricState& operator=(const SymmetricState&) = default;
  ~SymmetricState();  // wipes the chaining key
  void mix_hash(BytesView data);
  void mix_key(BytesView input_key_material);
  result<void> encrypt_and_hash(BytesView plaintext, Bytes& out);  // appends to `out`
  result<Bytes> decrypt_and_hash(BytesView ciphertext);
  bool has_key() const noexcept { return cs_.has_key(); }
  const Hash& handshake_hash() const noexcept { return h_; }
  // Split(): (initiator-to-responder, responder-to-initiator) cipher states.
  std::pair<CipherState, CipherState> split() const;

 private:
  Hash ck_{};
  Hash h_{};
  CipherState cs_;
};

enum class Role { initiator, responder };

// The two transport cipher states, oriented for one side, and the final handshake hash.
struct TransportCiphers {
  CipherState send;
  CipherState recv;
  Hash handshake_hash{};
};

// HandshakeState for the XX pattern:  -> e   <- e, ee, s, es   -> s, se
class XXHandshake {
 public:
  // `ephemeral` is for test vectors only; normally a fresh key is generated when needed.
  XXHandshake(Role role, X25519KeyPair static_key, BytesView prologue = {},
              std::optional<X25519KeyPair> ephemeral = std::nullopt);

  Role role() const noexcept { return role_; }
  // Index of the next message (0, 1, 2); 3 when complete.
  int step() const noexcept { return step_; }
  bool is_my_turn() const noexcept;
  bool complete() const noexcept { return step_ == 3 && !failed_; }
  bool failed() const noexcept { return failed_; }

  // Writes the next message carrying `payload` (errc::too_large if it would exceed 65535).
  result<Bytes> write_message(BytesView payload);
  // Reads the peer's next message and returns its payload.
  result<Bytes> read_message(BytesView message);

  // The peer's static key, once received (message 2 for the initiator, 3 for the responder).
  const std::optional<Key>& remote_static() const noexcept { return rs_; }
  const Key& local_static_public() const noexcept { return s_.public_key; }
  const Hash& handshake_hash() const noexcept { return ss_.handshake_hash(); }
  // Transport cipher states; errc::invalid_argument unless complete().
  result<TransportCiphers> split() const;

 private:
  result<Bytes> write_impl(BytesView payload);
  result<Bytes> read_impl(BytesView message);
  result<void> mix_dh(const Key& secret, const Key& remote);

  Role role_;
  SymmetricState ss_;
  X25519KeyPair s_;
  std::optional<X25519KeyPair> e_;
  std::optional<X25519KeyPair> preset_e_;
  std::optional<Key> re_;
  std::optional<Key> rs_;
  int step_ = 0;
  bool failed_ = false;
};

// ---- libp2p handshake payload ----

// "noise-libp2p-static-key:" || static public key: what the identity key signs.
Bytes static_key_signing_message(const Key& static_public);

// The NoiseHandshakePayload protobuf: identity_key = 1 (PublicKey protobuf), identity_sig = 2,
// extensions = 4 (NoiseExtensions: webtransport_certhashes = 1, stream_muxers = 2).
Bytes encode_handshake_payload(const crypto::KeyPair& identity, const Key& static_public,
                               const std::vector<std::string>& stream_muxers = {});

// A remote identity proven by a handshake payload.
struct VerifiedPeer {
  crypto::PublicKey key;
  PeerId peer;
  std::vector<std::string> stream_muxers;
};

// Parses `payload` and checks that its identity key signed `remote_static`.
// errc::protocol_violation with the reason on any failure.
result<VerifiedPeer> verify_handshake_payload(BytesView payload, const Key& remote_static);

// ---- the libp2p flavour of XX ----

struct HandshakeConfig {
  // Initiator only: the responder must prove this identity (checked before message 3 is sent).
  std::optional<PeerId> expected_remote;
  // Muxers to advertise in NoiseExtensions.stream_muxers (empty: no extensions field).
  std::vector<std::string> stream_muxers;
  // Default: a fresh static key per handshake (the spec allows it; nothing is stored).
  std::optional<X25519KeyPair> static_key;
  std::optional<X25519KeyPair> ephemeral_key;  // tests only
};

class Libp2pHandshake {
 public:
  Libp2pHandshake(Role role, const crypto::KeyPair& identity, HandshakeConfig config = {});

  Role role() const noexcept { return xx_.role(); }
  bool is_my_turn() const noexcept { return !failed_ && xx_.is_my_turn(); }
  bool complete() const noexcept { return !failed_ && xx_.complete() && remote_.has_value(); }
  bool failed() const noexcept { return failed_ || xx_.failed(); }

  // The next message to send (without the 2-byte length prefix). After any error the
  // handshake stays failed.
  result<Bytes> write_message();
  // Processes the peer's next message; verifies its payload when it carries one.
  result<void> read_message(BytesView message);

  // Set once the peer's payload was verified.
  const std::optional<VerifiedPeer>& remote() const noexcept { return remote_; }
  const XXHandshake& xx() const noexcept { return xx_; }
  result<TransportCiphers> split() const;

 private:
  result<void> read_impl(BytesView message);
  XXHandshake xx_;
  Bytes payload_;  // our signed payload (sent in message 2 or 3)
  std::optional<PeerId> expected_remote_;
  std::optional<VerifiedPeer> remote_;
  bool failed_ = false;
};

}  // namespace starling::net::noise
