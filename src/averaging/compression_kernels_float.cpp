// Kernels of the float codecs (none, float16, bfloat16). See compression_kernels.hpp.
#include <algorithm>

#include "averaging/compression_kernels.hpp"

namespace starling::averaging::detail {
namespace {

constexpr std::uint32_t kF32Exp = 0x7f800000u;
constexpr std::uint32_t kF16Exp = 0x7c00u;
constexpr std::uint32_t kBf16Exp = 0x7f80u;

// Writes (acc=false) or accumulates (acc=true) a decoded tile into `out`.
inline void emit_tile(const float* __restrict d, float* __restrict out, bool acc, float w) {
  if (acc) {
    for (std::size_t i = 0; i < kTile; ++i) out[i] += w * d[i];
  } else {
    std::memcpy(out, d, kTile * sizeof(float));
  }
}
inline void emit_tail(const float* d, float* out, std::size_t n, bool acc, float w) {
  if (acc) {
    for (std::size_t i = 0; i < n; ++i) out[i] += w * d[i];
  } else {
    std::memcpy(out, d, n * sizeof(float));
  }
}

// Converts a tile of floats to 16-bit codes with `conv`; returns the OR of "is inf/nan".
template <std::uint32_t (*Conv)(std::uint32_t), std::uint32_t ExpMask>
inline std::uint32_t to16_tile(const float* __restrict in, std::uint8_t* __restrict out) {
  std::uint32_t bits[kTile];
  std::uint16_t h[kTile];
  std::memcpy(bits, in, sizeof(bits));
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < kTile; ++i) {
    std::uint32_t r = Conv(bits[i]);
    bad |= static_cast<std::uint32_t>((r & ExpMask) == ExpMask);
    h[i] = static_cast<std::uint16_t>(r);
  }
  std::memcpy(out, h, sizeof(h));
  return bad;
}

template <std::uint32_t (*Conv)(std::uint32_t), std::uint32_t ExpMask>
std::uint32_t encode16(const float* in, std::size_t n, std::uint8_t* out) {
  std::uint32_t bad = 0;
  std::size_t i = 0;
  for (; i + kTile <= n; i += kTile) bad |= to16_tile<Conv, ExpMask>(in + i, out + 2 * i);
  if (i < n) {
    float pad[kTile] = {};
    std::uint8_t tmp[2 * kTile];
    std::memcpy(pad, in + i, (n - i) * sizeof(float));
    bad |= to16_tile<Conv, ExpMask>(pad, tmp);
    std::memcpy(out + 2 * i, tmp, 2 * (n - i));
  }
  return bad;
}

inline std::uint32_t bf16_to_f32_bits(std::uint32_t h) {
  return h << 16;
}

// Converts a tile of 16-bit codes to floats; returns the OR of "is inf/nan".
template <std::uint32_t (*Conv)(std::uint32_t), std::uint32_t ExpMask>
inline std::uint32_t from16_tile(const std::uint8_t* __restrict in, float* __restrict d) {
  std::uint16_t h[kTile];
  std::uint32_t bits[kTile];
  std::memcpy(h, in, sizeof(h));
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < kTile; ++i) {
    std::uint32_t v = h[i];
    bad |= static_cast<std::uint32_t>((v & ExpMask) == ExpMask);
    bits[i] = Conv(v);
  }
  std::memcpy(d, bits, sizeof(bits));
  return bad;
}

template <std::uint32_t (*Conv)(std::uint32_t), std::uint32_t ExpMask>
std::uint32_t decode16(const std::uint8_t* in, std::size_t n, float* out, bool acc, float w) {
  std::uint32_t bad = 0;
  float d[kTile];
  std::size_t i = 0;
  for (; i + kTile <= n; i += kTile) {
    bad |= from16_tile<Conv, ExpMask>(in + 2 * i, d);
    emit_tile(d, out + i, acc, w);
  }
  if (i < n) {
    std::uint8_t pad[2 * kTile] = {};
    std::memcpy(pad, in + 2 * i, 2 * (n - i));
    bad |= from16_tile<Conv, ExpMask>(pad, d);
    emit_tail(d, out + i, n - i, acc, w);
  }
  return bad;
}

template <std::uint32_t ExpMask, class T>
inline std::uint32_t scan_tile(const std::uint8_t* __restrict in) {
  T v[kTile];
  std::memcpy(v, in, sizeof(v));
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < kTile; ++i)
    bad |= static_cast<std::uint32_t>((v[i] & ExpMask) == ExpMask);
  return bad;
}

template <std::uint32_t ExpMask, class T>
std::uint32_t scan(const std::uint8_t* in, std::size_t n) {
  std::uint32_t bad = 0;
  std::size_t i = 0;
  for (; i + kTile <= n; i += kTile) bad |= scan_tile<ExpMask, T>(in + sizeof(T) * i);
  if (i < n) {
    std::uint8_t pad[sizeof(T) * kTile] = {};
    std::memcpy(pad, in + sizeof(T) * i, sizeof(T) * (n - i));
    bad |= scan_tile<ExpMask, T>(pad);
  }
  return bad;
}

}  // namespace

ST_KERNEL_CLONES std::uint32_t encode_f32(const float* in, std::size_t n, std::uint8_t* out) {
  // Copy and check tile by tile so the data is read from memory once.
  std::uint32_t bad = 0;
  std::size_t i = 0;
  for (; i + kTile <= n; i += kTile) {
    std::memcpy(out + 4 * i, in + i, kTile * sizeof(float));
    bad |= scan_tile<kF32Exp, std::uint32_t>(out + 4 * i);
  }
  if (i < n) {
    std::memcpy(out + 4 * i, in + i, (n - i) * sizeof(float));
    bad |= scan<kF32Exp, std::uint32_t>(out + 4 * i, n - i);
  }
  return bad;
}
ST_KERNEL_CLONES std::uint32_t encode_f16(const float* in, std::size_t n, std::uint8_t* out) {
  return encode16<f32_to_f16_bits, kF16Exp>(in, n, out);
}
ST_KERNEL_CLONES std::uint32_t encode_bf16(const float* in, std::size_t n, std::uint8_t* out) {
  return encode16<f32_to_bf16_bits, kBf16Exp>(in, n, out);
}

ST_KERNEL_CLONES std::uint32_t decode_f32(const std::uint8_t* in, std::size_t n, float* out,
                                          bool acc, float w) {
  if (!acc) {
    std::uint32_t bad = 0;
    std::size_t i = 0;
    for (; i + kTile <= n; i += kTile) {
      std::memcpy(out + i, in + 4 * i, kTile * sizeof(float));
      bad |= scan_tile<kF32Exp, std::uint32_t>(in + 4 * i);
    }
    if (i < n) {
      std::memcpy(out + i, in + 4 * i, (n - i) * sizeof(float));
      bad |= scan<kF32Exp, std::uint32_t>(in + 4 * i, n - i);
    }
    return bad;
  }
  float d[kTile];
  std::size_t i = 0;
  for (; i + kTile <= n; i += kTile) {
    std::memcpy(d, in + 4 * i, sizeof(d));
    emit_tile(d, out + i, true, w);
  }
  if (i < n) {
    std::memcpy(d, in + 4 * i, 4 * (n - i));
    emit_tail(d, out + i, n - i, true, w);
  }
  return 0;  // callers scan with check_f32 before accumulating
}
ST_KERNEL_CLONES std::uint32_t decode_f16(const std::uint8_t* in, std::size_t n, float* out,
                                          bool acc, float w) {
  return decode16<f16_to_f32_bits, kF16Exp>(in, n, out, acc, w);
}
ST_KERNEL_CLONES std::uint32_t decode_bf16(const std::uint8_t* in, std::size_t n, float* out,
                                           bool acc, float w) {
  return decode16<bf16_to_f32_bits, kBf16Exp>(in, n, out, acc, w);
}

ST_KERNEL_CLONES std::uint32_t check_f32(const std::uint8_t* in, std::size_t n) {
  return scan<kF32Exp, std::uint32_t>(in, n);
}
ST_KERNEL_CLONES std::uint32_t check_f16(const std::uint8_t* in, std::size_t n) {
  return scan<kF16Exp, std::uint16_t>(in, n);
}
ST_KERNEL_CLONES std::uint32_t check_bf16(const std::uint8_t* in, std::size_t n) {
  return scan<kBf16Exp, std::uint16_t>(in, n);
}

}  // namespace starling::averaging::detail
