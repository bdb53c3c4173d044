// ChaCha20-Poly1305 on OpenSSL's EVP interface (see aead.hpp).
#include "net/aead.hpp"

#include <openssl/evp.h>

#include <climits>
#include <memory>

namespace starling::net::noise {

namespace {

struct CtxDeleter {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using CtxPtr = std::unique_ptr<EVP_CIPHER_CTX, CtxDeleter>;

// One context per thread and direction, set up for the cipher once; each call only rekeys.
EVP_CIPHER_CTX* context(bool encrypt) {
  thread_local CtxPtr enc, dec;
  CtxPtr& c = encrypt ? enc : dec;
  if (!c) {
    CtxPtr fresh(EVP_CIPHER_CTX_new());
    if (!fresh) return nullptr;
    int ok =
        encrypt
            ? EVP_EncryptInit_ex(fresh.get(), EVP_chacha20_poly1305(), nullptr, nullptr, nullptr)
            : EVP_DecryptInit_ex(fresh.get(), EVP_chacha20_poly1305(), nullptr, nullptr, nullptr);
    if (ok != 1) return nullptr;
    c = std::move(fresh);
  }
  return c.get();
}

bool fits_int(std::size_t n) {
  return n <= static_cast<std::size_t>(INT_MAX);
}

}  // namespace

bool aead_seal(const std::uint8_t* key, const std::uint8_t* nonce, const std::uint8_t* ad,
               std::size_t ad_len, const std::uint8_t* in, std::size_t n, std::uint8_t* out,
               std::uint8_t* tag) {
  EVP_CIPHER_CTX* c = context(true);
  if (!c || !fits_int(n) || !fits_int(ad_len)) return false;
  int len = 0;
  if (EVP_EncryptInit_ex(c, nullptr, nullptr, key, nonce) != 1) return false;
  if (ad_len > 0 && EVP_EncryptUpdate(c, nullptr, &len, ad, static_cast<int>(ad_len)) != 1)
    return false;
  if (n > 0 && EVP_EncryptUpdate(c, out, &len, in, static_cast<int>(n)) != 1) return false;
  if (EVP_EncryptFinal_ex(c, out + (n > 0 ? len : 0), &len) != 1) return false;
  return EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, static_cast<int>(kAeadTagLen), tag) == 1;
}

bool aead_open(const std::uint8_t* key, const std::uint8_t* nonce, const std::uint8_t* ad,
               std::size_t ad_len, const std::uint8_t* in, std::size_t n, const std::uint8_t* tag,
               std::uint8_t* out) {
  EVP_CIPHER_CTX* c = context(false);
  if (!c || !fits_int(n) || !fits_int(ad_len)) return false;
  int len = 0;
  if (EVP_DecryptInit_ex(c, nullptr, nullptr, key, nonce) != 1) return false;
  if (ad_len > 0 && EVP_DecryptUpdate(c, nullptr, &len, ad, static_cast<int>(ad_len)) != 1)
    return false;
  if (n > 0 && EVP_DecryptUpdate(c, out, &len, in, static_cast<int>(n)) != 1) return false;
  // The ctrl takes a non-const pointer but only copies the tag.
  if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, static_cast<int>(kAeadTagLen),
                          const_cast<std::uint8_t*>(tag)) != 1)
    return false;
  std::uint8_t dummy[1];
  return EVP_DecryptFinal_ex(c, n > 0 ? out + len : dummy, &len) == 1;
}

}  // namespace starling::net::noise
