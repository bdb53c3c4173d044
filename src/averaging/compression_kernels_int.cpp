// Kernels of the integer codecs (uniform8, blockwise8, blockwise4) and chunk statistics.
// See compression_kernels.hpp.
#include <algorithm>

#include "averaging/compression_kernels.hpp"

namespace starling::averaging::detail {
namespace {

// Adding 1.5 * 2^23 to |t| < 2^22 leaves round-to-nearest-even(t) in the low mantissa bits.
constexpr float kRoundMagic = 12582912.0f;
constexpr std::int32_t kRoundMagicBits = 0x4b400000;

inline std::int32_t round_small(float t) {
  return static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(t + kRoundMagic)) - kRoundMagicBits;
}

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

struct TileStats {
  std::int32_t lo, hi;
  std::uint32_t abs;
};

inline void stats_tile(const float* __restrict in, TileStats& s) {
  std::uint32_t bits[kTile];
  std::memcpy(bits, in, sizeof(bits));
  std::int32_t lo = s.lo, hi = s.hi;
  std::uint32_t ab = s.abs;
  for (std::size_t i = 0; i < kTile; ++i) {
    std::int32_t k = order_key(bits[i]);
    lo = k < lo ? k : lo;
    hi = k > hi ? k : hi;
    std::uint32_t a = bits[i] & 0x7fffffffu;
    ab = a > ab ? a : ab;
  }
  s = {lo, hi, ab};
}

inline std::uint32_t abs_tile(const float* __restrict in, std::uint32_t ab) {
  std::uint32_t bits[kTile];
  std::memcpy(bits, in, sizeof(bits));
  for (std::size_t i = 0; i < kTile; ++i) {
    std::uint32_t a = bits[i] & 0x7fffffffu;
    ab = a > ab ? a : ab;
  }
  return ab;
}

// Pads a tail tile by repeating its first value (neutral for min/max/absmax).
inline void pad_tail(const float* in, std::size_t n, float* pad) {
  for (std::size_t i = 0; i < kTile; ++i) pad[i] = i < n ? in[i] : in[0];
}

inline void affine_tile(const float* __restrict in, float mid, float inv,
                        std::uint8_t* __restrict out) {
  for (std::size_t i = 0; i < kTile; ++i) {
    std::int32_t q = round_small((in[i] - mid) * inv + 127.5f);
    q = q < 0 ? 0 : q;
    q = q > 255 ? 255 : q;
    out[i] = static_cast<std::uint8_t>(q);
  }
}

inline void unaffine_tile(const std::uint8_t* __restrict in, float mid, float step,
                          float* __restrict d) {
  for (std::size_t i = 0; i < kTile; ++i) d[i] = mid + (static_cast<float>(in[i]) - 127.5f) * step;
}

inline void sym_tile(const float* __restrict in, float inv, std::int32_t limit,
                     std::int32_t* __restrict q) {
  for (std::size_t i = 0; i < kTile; ++i) {
    std::int32_t v = round_small(in[i] * inv);
    v = v < -limit ? -limit : v;
    v = v > limit ? limit : v;
    q[i] = v;
  }
}

inline void sym8_tile(const float* __restrict in, float inv, std::uint8_t* __restrict out) {
  std::int32_t q[kTile];
  sym_tile(in, inv, 127, q);
  for (std::size_t i = 0; i < kTile; ++i) out[i] = static_cast<std::uint8_t>(q[i]);
}

inline void unsym8_tile(const std::uint8_t* __restrict in, float scale, float* __restrict d) {
  for (std::size_t i = 0; i < kTile; ++i) {
    std::int32_t q = static_cast<std::int8_t>(in[i]);
    q = q < -127 ? -127 : q;
    d[i] = static_cast<float>(q) * scale;
  }
}

// kTile values -> kTile / 2 bytes.
inline void sym4_tile(const float* __restrict in, float inv, std::uint8_t* __restrict out) {
  std::int32_t q[kTile];
  sym_tile(in, inv, 7, q);
  for (std::size_t j = 0; j < kTile / 2; ++j)
    out[j] = static_cast<std::uint8_t>((q[2 * j] + 8) | ((q[2 * j + 1] + 8) << 4));
}

inline void unsym4_tile(const std::uint8_t* __restrict in, float scale, float* __restrict d) {
  for (std::size_t j = 0; j < kTile / 2; ++j) {
    std::int32_t lo = static_cast<std::int32_t>(in[j] & 15u) - 8;
    std::int32_t hi = static_cast<std::int32_t>(in[j] >> 4) - 8;
    lo = lo < -7 ? -7 : lo;
    hi = hi < -7 ? -7 : hi;
    d[2 * j] = static_cast<float>(lo) * scale;
    d[2 * j + 1] = static_cast<float>(hi) * scale;
  }
}

}  // namespace

ST_KERNEL_CLONES Stats chunk_stats(const float* in, std::size_t n) {
  TileStats s{INT32_MAX, INT32_MIN, 0};
  std::size_t i = 0;
  for (; i + kTile <= n; i += kTile) stats_tile(in + i, s);
  if (i < n) {
    float pad[kTile];
    pad_tail(in + i, n - i, pad);
    stats_tile(pad, s);
  }
  return {s.lo, s.hi, s.abs};
}

ST_KERNEL_CLONES std::uint32_t max_abs_bits(const float* in, std::size_t n) {
  std::uint32_t ab = 0;
  std::size_t i = 0;
  for (; i + kTile <= n; i += kTile) ab = abs_tile(in + i, ab);
  if (i < n) {
    float pad[kTile];
    pad_tail(in + i, n - i, pad);
    ab = abs_tile(pad, ab);
  }
  return ab;
}

ST_KERNEL_CLONES void encode_affine8(const float* in, std::size_t n, float mid, float inv_step,
                                     std::uint8_t* out) {
  std::size_t i = 0;
  for (; i + kTile <= n; i += kTile) affine_tile(in + i, mid, inv_step, out + i);
  if (i < n) {
    float pad[kTile];
    std::uint8_t tmp[kTile];
    pad_tail(in + i, n - i, pad);
    affine_tile(pad, mid, inv_step, tmp);
    std::memcpy(out + i, tmp, n - i);
  }
}

ST_KERNEL_CLONES void decode_affine8(const std::uint8_t* in, std::size_t n, float mid, float step,
                                     float* out, bool acc, float w) {
  float d[kTile];
  std::size_t i = 0;
  for (; i + kTile <= n; i += kTile) {
    unaffine_tile(in + i, mid, step, d);
    emit_tile(d, out + i, acc, w);
  }
  if (i < n) {
    std::uint8_t pad[kTile] = {};
    std::memcpy(pad, in + i, n - i);
    unaffine_tile(pad, mid, step, d);
    emit_tail(d, out + i, n - i, acc, w);
  }
}

ST_KERNEL_CLONES void encode_sym8(const float* in, std::size_t n, float inv_scale,
                                  std::uint8_t* out) {
  std::size_t i = 0;
  for (; i + kTile <= n; i += kTile) sym8_tile(in + i, inv_scale, out + i);
  if (i < n) {
    float pad[kTile];
    std::uint8_t tmp[kTile];
    pad_tail(in + i, n - i, pad);
    sym8_tile(pad, inv_scale, tmp);
    std::memcpy(out + i, tmp, n - i);
  }
}

ST_KERNEL_CLONES void decode_sym8(const std::uint8_t* in, std::size_t n, float scale, float* out,
                                  bool acc, float w) {
  float d[kTile];
  std::size_t i = 0;
  for (; i + kTile <= n; i += kTile) {
    unsym8_tile(in + i, scale, d);
    emit_tile(d, out + i, acc, w);
  }
  if (i < n) {
    std::uint8_t pad[kTile] = {};
    std::memcpy(pad, in + i, n - i);
    unsym8_tile(pad, scale, d);
    emit_tail(d, out + i, n - i, acc, w);
  }
}

ST_KERNEL_CLONES void encode_sym4(const float* in, std::size_t n, float inv_scale,
                                  std::uint8_t* out) {
  std::size_t i = 0;
  for (; i + kTile <= n; i += kTile) sym4_tile(in + i, inv_scale, out + i / 2);
  if (i < n) {
    float pad[kTile];
    std::uint8_t tmp[kTile / 2];
    std::size_t rest = n - i;
    pad_tail(in + i, rest, pad);
    sym4_tile(pad, inv_scale, tmp);
    std::size_t bytes = (rest + 1) / 2;
    if (rest % 2) tmp[bytes - 1] &= 0x0fu;  // the unused high nibble of an odd count is 0
    std::memcpy(out + i / 2, tmp, bytes);
  }
}

ST_KERNEL_CLONES void decode_sym4(const std::uint8_t* in, std::size_t n, float scale, float* out,
                                  bool acc, float w) {
  float d[kTile];
  std::size_t i = 0;
  for (; i + kTile <= n; i += kTile) {
    unsym4_tile(in + i / 2, scale, d);
    emit_tile(d, out + i, acc, w);
  }
  if (i < n) {
    std::uint8_t pad[kTile / 2] = {};
    std::memcpy(pad, in + i / 2, (n - i + 1) / 2);
    unsym4_tile(pad, scale, d);
    emit_tail(d, out + i, n - i, acc, w);
  }
}

}  // namespace starling::averaging::detail
