// Noise primitives for the 25519 / ChaChaPoly / SHA256 suite: X25519 (libsodium, RFC 7748),
// ChaChaPoly (net/aead.hpp, libcrypto), HMAC-SHA256 HKDF, CipherState and SymmetricState (Noise
// Protocol Framework, sections 4 and 5).
#include <sodium.h>

#include <cstring>
#include <limits>

#include "net/aead.hpp"
#include "net/noise_handshake.hpp"

namespace starling::net::noise {

namespace {

// ChaChaPoly nonce: 32 bits of zeros followed by the 64-bit counter, little-endian.
void make_nonce(std::uint64_t n, std::uint8_t out[12]) {
  std::memset(out, 0, 4);
  for (int i = 0; i < 8; ++i) out[4 + i] = static_cast<std::uint8_t>(n >> (8 * i));
}

// libsodium and memcpy must not see null pointers, even for empty ranges.
const std::uint8_t* nonnull(const std::uint8_t* p) {
  static const std::uint8_t dummy = 0;
  return p ? p : &dummy;
}

Hash hmac_sha256(const Hash& key, BytesView a, BytesView b = {}) {
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, key.data(), key.size());
  crypto_auth_hmacsha256_update(&st, nonnull(a.data()), a.size());
  crypto_auth_hmacsha256_update(&st, nonnull(b.data()), b.size());
  Hash out;
  crypto_auth_hmacsha256_final(&st, out.data());
  sodium_memzero(&st, sizeof st);
  return out;
}

}  // namespace

X25519KeyPair::~X25519KeyPair() {
  sodium_memzero(secret.data(), secret.size());
}

X25519KeyPair X25519KeyPair::generate() {
  crypto::ensure_sodium();
  X25519KeyPair kp;
  randombytes_buf(kp.secret.data(), kp.secret.size());
  crypto_scalarmult_curve25519_base(kp.public_key.data(), kp.secret.data());
  return kp;
}

result<X25519KeyPair> X25519KeyPair::from_secret(BytesView secret) {
  crypto::ensure_sodium();
  if (secret.size() != kDhLen)
    return make_error(errc::invalid_argument,
                      "X25519 private key must be 32 bytes, got " + std::to_string(secret.size()));
  X25519KeyPair kp;
  std::memcpy(kp.secret.data(), secret.data(), kDhLen);
  if (crypto_scalarmult_curve25519_base(kp.public_key.data(), kp.secret.data()) != 0)
    return make_error(errc::invalid_argument, "X25519 private key gives no public key");
  return kp;
}

result<Key> x25519(const Key& secret, BytesView remote_public) {
  if (remote_public.size() != kDhLen)
    return make_error(errc::protocol_violation, "X25519 public key must be 32 bytes");
  Key out;
  if (crypto_scalarmult_curve25519(out.data(), secret.data(), remote_public.data()) != 0)
    return make_error(errc::protocol_violation, "X25519 with a low-order public key");
  return out;
}

std::pair<Hash, Hash> hkdf2(const Hash& chaining_key, BytesView input_key_material) {
  Hash temp = hmac_sha256(chaining_key, input_key_material);
  const std::uint8_t one = 0x01, two = 0x02;
  Hash out1 = hmac_sha256(temp, BytesView(&one, 1));
  Hash out2 = hmac_sha256(temp, out1, BytesView(&two, 1));
  sodium_memzero(temp.data(), temp.size());
  return {out1, out2};
}

// ---- CipherState ----

CipherState::~CipherState() {
  sodium_memzero(k_.data(), k_.size());
}

void CipherState::init_key(const Key& k) noexcept {
  k_ = k;
  has_key_ = true;
  n_ = 0;
}

result<void> CipherState::check_nonce() const {
  if (n_ == std::numeric_limits<std::uint64_t>::max())
    return make_error(errc::protocol_violation, "noise nonce space exhausted");
  return success();
}

result<void> CipherState::encrypt_with_ad(BytesView ad, BytesView plaintext, Bytes& out) {
  std::size_t old = out.size();
  if (!has_key_) {
    out.insert(out.end(), plaintext.begin(), plaintext.end());
    return success();
  }
  ST_TRY(check_nonce());
  out.resize(old + plaintext.size() + kTagLen);
  std::uint8_t nonce[12];
  make_nonce(n_, nonce);
  std::uint8_t* c = out.data() + old;
  if (!aead_seal(k_.data(), nonce, ad.data(), ad.size(), plaintext.data(), plaintext.size(), c,
                 c + plaintext.size()))
    return make_error(errc::internal, "ChaCha20-Poly1305 encryption failed (libcrypto)");
  ++n_;
  return success();
}

result<Bytes> CipherState::decrypt_with_ad(BytesView ad, BytesView ciphertext) {
  if (!has_key_) return Bytes(ciphertext.begin(), ciphertext.end());
  ST_TRY(check_nonce());
  if (ciphertext.size() < kTagLen)
    return make_error(errc::protocol_violation, "ciphertext shorter than its 16-byte tag");
  std::size_t n = ciphertext.size() - kTagLen;
  Bytes out(n);
  std::uint8_t nonce[12];
  make_nonce(n_, nonce);
  if (!aead_open(k_.data(), nonce, ad.data(), ad.size(), ciphertext.data(), n,
                 ciphertext.data() + n, out.data()))
    return make_error(errc::protocol_violation, "decryption failed (bad authentication tag)");
  ++n_;
  return out;
}

result<void> CipherState::seal(const std::uint8_t* in, std::size_t n, std::uint8_t* out) {
  if (!has_key_) return make_error(errc::internal, "noise cipher has no key");
  ST_TRY(check_nonce());
  std::uint8_t nonce[12];
  make_nonce(n_, nonce);
  if (!aead_seal(k_.data(), nonce, nullptr, 0, in, n, out, out + n))
    return make_error(errc::internal, "ChaCha20-Poly1305 encryption failed (libcrypto)");
  ++n_;
  return success();
}

result<void> CipherState::open(const std::uint8_t* in, std::size_t len, std::uint8_t* out) {
  if (!has_key_) return make_error(errc::internal, "noise cipher has no key");
  ST_TRY(check_nonce());
  if (len < kTagLen)
    return make_error(errc::protocol_violation, "noise frame shorter than its 16-byte tag");
  std::size_t n = len - kTagLen;
  std::uint8_t nonce[12];
  make_nonce(n_, nonce);
  if (!aead_open(k_.data(), nonce, nullptr, 0, in, n, in + n, out))
    return make_error(errc::protocol_violation, "decryption failed (bad authentication tag)");
  ++n_;
  return success();
}

// ---- SymmetricState ----

SymmetricState::SymmetricState(std::string_view protocol_name) {
  if (protocol_name.size() <= kHashLen) {
    std::memcpy(h_.data(), protocol_name.data(), protocol_name.size());
  } else {
    crypto_hash_sha256(h_.data(), reinterpret_cast<const std::uint8_t*>(protocol_name.data()),
                       protocol_name.size());
  }
  ck_ = h_;
}

SymmetricState::~SymmetricState() {
  sodium_memzero(ck_.data(), ck_.size());
}

void SymmetricState::mix_hash(BytesView data) {
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  crypto_hash_sha256_update(&st, h_.data(), h_.size());
  crypto_hash_sha256_update(&st, nonnull(data.data()), data.size());
  crypto_hash_sha256_final(&st, h_.data());
}

void SymmetricState::mix_key(BytesView input_key_material) {
  auto [ck, temp_k] = hkdf2(ck_, input_key_material);
  ck_ = ck;
  cs_.init_key(temp_k);  // HASHLEN is 32, so no truncation is needed
  sodium_memzero(ck.data(), ck.size());
  sodium_memzero(temp_k.data(), temp_k.size());
}

result<void> SymmetricState::encrypt_and_hash(BytesView plaintext, Bytes& out) {
  std::size_t old = out.size();
  ST_TRY(cs_.encrypt_with_ad(h_, plaintext, out));
  mix_hash(BytesView(out).subspan(old));
  return success();
}

result<Bytes> SymmetricState::decrypt_and_hash(BytesView ciphertext) {
  ST_TRY(auto plaintext, cs_.decrypt_with_ad(h_, ciphertext));
  mix_hash(ciphertext);
  return plaintext;
}

std::pair<CipherState, CipherState> SymmetricState::split() const {
  auto [k1, k2] = hkdf2(ck_, {});
  std::pair<CipherState, CipherState> out{CipherState(k1), CipherState(k2)};
  sodium_memzero(k1.data(), k1.size());
  sodium_memzero(k2.data(), k2.size());
  return out;
}

}  // namespace starling::net::noise
