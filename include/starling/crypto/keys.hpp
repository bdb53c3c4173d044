// Identity keys (libp2p crypto): Ed25519 key pairs from libsodium, the libp2p protobuf
// encoding of public keys (crypto.proto: KeyType type = 1; bytes Data = 2), signature
// verification, SHA-256, and identity files (0600) on disk.
// Threading: everything here is safe to call from any thread; KeyPair/PublicKey are immutable
// values. The identity-file functions do blocking file I/O (call them at startup).
#pragma once

#include <array>
#include <filesystem>
#include <string>

#include "starling/core/bytes.hpp"
#include "starling/core/result.hpp"

namespace starling::crypto {

enum class KeyType : int { rsa = 0, ed25519 = 1, secp256k1 = 2, ecdsa = 3 };

class PublicKey {
 public:
  PublicKey() = default;
  PublicKey(KeyType type, Bytes data) : type_(type), data_(std::move(data)) {}
  KeyType type() const noexcept { return type_; }
  const Bytes& data() const noexcept { return data_; }  // raw key bytes (32 for Ed25519)

  // Deterministic libp2p protobuf encoding (field 1 varint, then field 2 bytes).
  Bytes to_protobuf() const;
  // Parses the protobuf form; rejects unknown types, missing fields, wrong Ed25519 length.
  static result<PublicKey> from_protobuf(BytesView pb);

  // True iff `sig` is a valid signature of `msg`. Only Ed25519 is supported; other key types
  // return false.
  bool verify(BytesView msg, BytesView sig) const;

  friend bool operator==(const PublicKey&, const PublicKey&) = default;

 private:
  KeyType type_ = KeyType::ed25519;
  Bytes data_;
};

class KeyPair {
 public:
  KeyPair() = default;  // all-zero placeholder; use generate() / from_seed()
  KeyPair(const KeyPair&) = default;
  KeyPair(KeyPair&&) = default;
  KeyPair& operator=(const KeyPair&) = default;
  KeyPair& operator=(KeyPair&&) = default;
  ~KeyPair();  // wipes the secret

  static KeyPair generate();
  // Deterministic key pair from a 32-byte seed.
  static result<KeyPair> from_seed(BytesView seed);
  const PublicKey& public_key() const noexcept { return public_; }
  Bytes sign(BytesView msg) const;  // 64-byte Ed25519 signature
  BytesView seed() const noexcept { return seed_; }

  // The libp2p PrivateKey protobuf (Type = Ed25519, Data = seed || public key, 64 bytes).
  Bytes to_private_protobuf() const;
  // Parses a PrivateKey protobuf: Ed25519 only (others: errc::unsupported); Data of 64 bytes
  // (seed || public) or the legacy 96 (seed || public || public); the public half must match
  // the seed. Malformed input: errc::invalid_argument.
  static result<KeyPair> from_private_protobuf(BytesView pb);

 private:
  std::array<std::uint8_t, 32> seed_{};
  std::array<std::uint8_t, 64> secret_{};  // libsodium form: seed || public key
  PublicKey public_;
};

using Sha256 = std::array<std::uint8_t, 32>;
Sha256 sha256(BytesView data);

// Identity file: the libp2p PrivateKey protobuf (type Ed25519, Data = 64-byte secret) written
// atomically with mode 0600. load_identity fails with errc::permission if the file is readable
// by group/others, errc::not_found if missing, errc::invalid_argument if malformed, errc::io if
// unreadable. Errors name the path.
result<void> save_identity(const std::filesystem::path& path, const KeyPair& key);
result<KeyPair> load_identity(const std::filesystem::path& path);
// Loads `path`, or creates a new identity there if it does not exist (`created` set).
result<KeyPair> load_or_create_identity(const std::filesystem::path& path, bool* created = nullptr);

// Ensures libsodium is initialised (called by everything here; cheap after the first call).
void ensure_sodium();

}  // namespace starling::crypto
