// Ed25519 key pairs, public-key protobufs, signatures and SHA-256 on libsodium.
#include "starling/crypto/keys.hpp"

#include <sodium.h>

#include <cstdlib>
#include <cstring>

#include "crypto/key_codec.hpp"

namespace starling::crypto {
namespace {

constexpr std::size_t kEd25519PublicSize = 32;
constexpr std::size_t kEd25519SeedSize = 32;
constexpr std::size_t kEd25519SignatureSize = 64;

static_assert(crypto_sign_PUBLICKEYBYTES == kEd25519PublicSize);
static_assert(crypto_sign_SEEDBYTES == kEd25519SeedSize);
static_assert(crypto_sign_SECRETKEYBYTES == 64);
static_assert(crypto_sign_BYTES == kEd25519SignatureSize);
static_assert(crypto_hash_sha256_BYTES == 32);

// Per-type sanity checks on the Data field of a public key.
result<void> check_public_data(KeyType type, BytesView data) {
  switch (type) {
    case KeyType::ed25519:
      if (data.size() != kEd25519PublicSize) {
        return make_error(errc::invalid_argument, "Ed25519 public key must be 32 bytes, got " +
                                                      std::to_string(data.size()));
      }
      return success();
    case KeyType::secp256k1:
      // Compressed (33) or uncompressed (65) SEC1 point.
      if (data.size() != 33 && data.size() != 65) {
        return make_error(
            errc::invalid_argument,
            "secp256k1 public key must be 33 or 65 bytes, got " + std::to_string(data.size()));
      }
      return success();
    case KeyType::rsa:
    case KeyType::ecdsa:
      if (data.empty()) return make_error(errc::invalid_argument, "empty public key");
      return success();
  }
  return make_error(errc::invalid_argument, "unknown key type");
}

}  // namespace

void ensure_sodium() {
  // C++ guarantees thread-safe one-time initialisation of function statics.
  static const int rc = sodium_init();
  if (rc < 0) std::abort();  // libsodium cannot work at all (no entropy source)
}

// ---- PublicKey ----

Bytes PublicKey::to_protobuf() const {
  return detail::encode_key_message(type_, data_);
}

result<PublicKey> PublicKey::from_protobuf(BytesView pb) {
  ST_TRY(auto msg, detail::decode_key_message(pb, "public key"));
  if (auto ok = check_public_data(msg.type, msg.data); !ok) {
    return ok.error().with_context("public key protobuf");
  }
  return PublicKey(msg.type, Bytes(msg.data.begin(), msg.data.end()));
}

bool PublicKey::verify(BytesView msg, BytesView sig) const {
  if (type_ != KeyType::ed25519 || data_.size() != kEd25519PublicSize ||
      sig.size() != kEd25519SignatureSize) {
    return false;
  }
  ensure_sodium();
  return crypto_sign_verify_detached(sig.data(), msg.data(), msg.size(), data_.data()) == 0;
}

// ---- KeyPair ----

KeyPair::~KeyPair() {
  sodium_memzero(seed_.data(), seed_.size());
  sodium_memzero(secret_.data(), secret_.size());
}

KeyPair KeyPair::generate() {
  ensure_sodium();
  std::array<std::uint8_t, kEd25519SeedSize> seed;
  randombytes_buf(seed.data(), seed.size());
  auto kp = from_seed(seed);
  sodium_memzero(seed.data(), seed.size());
  return std::move(kp).value();  // cannot fail: the seed has the right size
}

result<KeyPair> KeyPair::from_seed(BytesView seed) {
  if (seed.size() != kEd25519SeedSize) {
    return make_error(errc::invalid_argument,
                      "Ed25519 seed must be 32 bytes, got " + std::to_string(seed.size()));
  }
  ensure_sodium();
  KeyPair kp;
  std::memcpy(kp.seed_.data(), seed.data(), seed.size());
  Bytes pub(kEd25519PublicSize);
  if (crypto_sign_seed_keypair(pub.data(), kp.secret_.data(), kp.seed_.data()) != 0) {
    return make_error(errc::internal, "crypto_sign_seed_keypair failed");
  }
  kp.public_ = PublicKey(KeyType::ed25519, std::move(pub));
  return kp;
}

Bytes KeyPair::sign(BytesView msg) const {
  ensure_sodium();
  Bytes sig(kEd25519SignatureSize);
  crypto_sign_detached(sig.data(), nullptr, msg.data(), msg.size(), secret_.data());
  return sig;
}

Bytes KeyPair::to_private_protobuf() const {
  return detail::encode_key_message(KeyType::ed25519, secret_);
}

result<KeyPair> KeyPair::from_private_protobuf(BytesView pb) {
  ST_TRY(auto msg, detail::decode_key_message(pb, "private key"));
  if (msg.type != KeyType::ed25519) {
    return make_error(errc::unsupported, "private key type " +
                                             std::to_string(static_cast<int>(msg.type)) +
                                             " is not supported (only Ed25519)");
  }
  BytesView data = msg.data;
  if (data.size() == 96) {
    // Legacy layout: seed || public || public; both copies of the public key must agree.
    if (sodium_memcmp(data.data() + 32, data.data() + 64, 32) != 0) {
      return make_error(errc::invalid_argument,
                        "legacy 96-byte Ed25519 private key has two different public keys");
    }
    data = data.first(64);
  }
  if (data.size() != 64) {
    return make_error(errc::invalid_argument, "Ed25519 private key Data must be 64 bytes, got " +
                                                  std::to_string(data.size()));
  }
  ST_TRY(auto kp, from_seed(data.first(kEd25519SeedSize)));
  if (sodium_memcmp(kp.public_.data().data(), data.data() + kEd25519SeedSize, kEd25519PublicSize) !=
      0) {
    return make_error(errc::invalid_argument,
                      "Ed25519 private key: stored public key does not match the seed");
  }
  return kp;
}

// ---- hashing ----

Sha256 sha256(BytesView data) {
  ensure_sodium();
  Sha256 out;
  crypto_hash_sha256(out.data(), data.data(), data.size());
  return out;
}

}  // namespace starling::crypto
