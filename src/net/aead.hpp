// Private to net/: ChaCha20-Poly1305 (RFC 8439, the IETF variant with a 96-bit nonce) for
// Noise. OpenSSL's libcrypto does the bulk work: on this project's machines its AVX2 code is
// about 1.8x faster than libsodium's, and transport throughput is bound by this cipher.
// Threading rule: free functions, safe from any thread (each thread keeps its own context).
#pragma once

#include <cstddef>
#include <cstdint>

namespace starling::net::noise {

inline constexpr std::size_t kAeadKeyLen = 32;
inline constexpr std::size_t kAeadNonceLen = 12;
inline constexpr std::size_t kAeadTagLen = 16;

// Encrypts n bytes of `in` to `out` (which may equal `in`) and writes the 16-byte tag to
// `tag`. `ad` may be null when ad_len is 0. Returns false only if libcrypto fails.
bool aead_seal(const std::uint8_t* key, const std::uint8_t* nonce, const std::uint8_t* ad,
               std::size_t ad_len, const std::uint8_t* in, std::size_t n, std::uint8_t* out,
               std::uint8_t* tag);

// Decrypts n bytes of `in` to `out` (which may equal `in`) and checks `tag`. Returns false
// when authentication fails; `out` must then be treated as garbage.
bool aead_open(const std::uint8_t* key, const std::uint8_t* nonce, const std::uint8_t* ad,
               std::size_t ad_len, const std::uint8_t* in, std::size_t n, const std::uint8_t* tag,
               std::uint8_t* out);

}  // namespace starling::net::noise
