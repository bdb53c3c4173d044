// Private: the arithmetic kernels behind the codecs and the wire layout they share.
// Kernels work on raw pointers over a range of values and do no validation; the drivers in
// compression_codec.cpp check sizes and parameters first.
//
// Threading rule: pure functions; disjoint ranges may run concurrently.
//
// Vectorisation: every loop over values works on tiles of kTile values with a constant trip
// count and __restrict pointers, so GCC and clang vectorise it even at -O2 (GCC's
// "very cheap" cost model) for plain x86-64; tails are copied into a padded tile.
// The quantile codec's bin search is scalar (table lookups), about 10x slower than the rest.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "starling/averaging/compression.hpp"

// The range kernels are compiled twice on x86-64, for AVX2 and for the baseline, and the
// loader picks one at startup (GCC and clang function multiversioning), so builds need no
// -march flag and still use 256-bit vectors where the CPU has them.
// ThreadSanitizer and MemorySanitizer instrument the ifunc resolver, which runs during
// relocation before their runtime exists and crashes; such builds use the baseline kernels.
#if defined(__SANITIZE_THREAD__)
#define ST_NO_CLONES_FOR_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define ST_NO_CLONES_FOR_SANITIZER 1
#endif
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(STARLING_NO_TARGET_CLONES) && !defined(ST_NO_CLONES_FOR_SANITIZER)
#define ST_KERNEL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define ST_KERNEL_CLONES
#endif

static_assert(std::endian::native == std::endian::little,
              "the codecs write little-endian payloads by copying memory");

namespace starling::averaging::detail {

inline constexpr std::size_t kTile = 64;
// Parallel work unit for the float codecs (they have no chunks on the wire).
inline constexpr std::size_t kFloatUnit = std::size_t{1} << 14;
inline constexpr std::size_t kQuantileBins = 256;
inline constexpr std::size_t kQuantileSample = 2048;

// Where everything is in an encoded buffer.
struct Layout {
  CodecId codec = CodecId::none;
  std::uint8_t block_log2 = 0;
  std::uint64_t count = 0;
  std::size_t block = 0;        // values per chunk (0: float codec)
  std::size_t chunks = 0;       // parameter sets
  std::size_t param_bytes = 0;  // bytes of parameters per chunk
  std::size_t params_offset = kHeaderSize;
  std::size_t payload_offset = kHeaderSize;
  std::size_t total = kHeaderSize;

  // Units of parallel work: chunks, or kFloatUnit values for float codecs.
  std::size_t units() const;
  std::size_t unit_size() const { return block ? block : kFloatUnit; }
  // Byte offset of value `i` in the payload (i even for blockwise4).
  std::size_t payload_pos(std::size_t i) const;
};

// Checks the spec and count (errc::invalid_argument) and computes the layout.
result<Layout> make_layout(CodecSpec spec, std::uint64_t count);
void write_header(const Layout& l, std::uint8_t* out);
// Parses and checks the header and the exact total size.
result<Layout> parse_layout(BytesView buf);
// Checks every chunk's parameters (finite scales, sorted codebooks, padding nibble).
result<void> validate_params(const Layout& l, BytesView buf);

inline float load_f32(const std::uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}
inline void store_f32(std::uint8_t* p, float f) {
  std::memcpy(p, &f, 4);
}

// ---- scalar conversions (also used by the tile kernels) ----

// float32 bits -> IEEE binary16 bits, round to nearest even; overflow gives inf, nan stays
// a quiet nan with the top payload bits kept.
inline std::uint32_t f32_to_f16_bits(std::uint32_t x) {
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t a = x & 0x7fffffffu;
  // Normal half: rebias the exponent (127 -> 15) and round the 13 dropped bits to even; a
  // carry out of the mantissa correctly bumps the exponent.
  std::uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  // Half subnormal (|x| < 2^-14): adding 0.5 puts the value in units of 2^-24 into the low
  // mantissa bits, rounded to nearest even by the FPU; 0x400 (2^-14) is the right encoding
  // when it rounds up to the smallest normal.
  float shifted = std::bit_cast<float>(a) + 0.5f;
  std::uint32_t sub = std::bit_cast<std::uint32_t>(shifted) - 0x3f000000u;
  std::uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  // Selections by masks rather than ?: so compilers do not move the float addition into a
  // branch (which, under -ftrapping-math, blocks vectorisation).
  std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(a < 0x38800000u);
  std::uint32_t is_inf = 0u - static_cast<std::uint32_t>(a >= 0x477ff000u);  // >= 65520
  std::uint32_t is_nan = 0u - static_cast<std::uint32_t>(a > 0x7f800000u);
  std::uint32_t r = (sub & is_sub) | (normal & ~is_sub);
  r = (r & ~is_inf) | (0x7c00u & is_inf);
  r = (r & ~is_nan) | (nan & is_nan);
  return r | sign;
}

inline std::uint32_t f16_to_f32_bits(std::uint32_t h) {
  std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  std::uint32_t normal = ((e + 112u) << 23) | (m << 13);
  // Subnormal (and zero): m * 2^-24, exact, computed without denormal arithmetic.
  std::uint32_t sub =
      std::bit_cast<std::uint32_t>(static_cast<float>(static_cast<int>(m)) * 0x1p-24f);
  std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(e == 0);
  std::uint32_t is_special = 0u - static_cast<std::uint32_t>(e == 31);
  std::uint32_t r = (sub & is_sub) | (normal & ~is_sub);
  // e == 31: normal is 0x47800000 | m << 13, so OR-ing the full exponent gives inf/nan.
  r |= 0x7f800000u & is_special;
  return r | sign;
}

// float32 bits -> bfloat16 bits, round to nearest even; nan stays a quiet nan.
inline std::uint32_t f32_to_bf16_bits(std::uint32_t x) {
  std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  std::uint32_t nan = (x >> 16) | 0x40u;
  return (x & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

// Order-preserving map of non-nan float bits to int32 (an involution).
inline std::int32_t order_key(std::uint32_t bits) {
  auto s = static_cast<std::int32_t>(bits);
  return s ^ ((s >> 31) & 0x7fffffff);
}
inline float from_order_key(std::int32_t k) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(k ^ ((k >> 31) & 0x7fffffff)));
}

// ---- range kernels (n values starting at the given pointers) ----

// Float codecs. Encoders return nonzero if an output is inf/nan (input or float16 overflow).
// Decoders with acc=false store, with acc=true do out += w * value; they return nonzero if
// the payload held inf/nan. check_* only scan the payload.
std::uint32_t encode_f32(const float* in, std::size_t n, std::uint8_t* out);
std::uint32_t encode_f16(const float* in, std::size_t n, std::uint8_t* out);
std::uint32_t encode_bf16(const float* in, std::size_t n, std::uint8_t* out);
std::uint32_t decode_f32(const std::uint8_t* in, std::size_t n, float* out, bool acc, float w);
std::uint32_t decode_f16(const std::uint8_t* in, std::size_t n, float* out, bool acc, float w);
std::uint32_t decode_bf16(const std::uint8_t* in, std::size_t n, float* out, bool acc, float w);
std::uint32_t check_f32(const std::uint8_t* in, std::size_t n);
std::uint32_t check_f16(const std::uint8_t* in, std::size_t n);
std::uint32_t check_bf16(const std::uint8_t* in, std::size_t n);

// Chunk statistics: min/max as order keys and the largest |x| bit pattern
// (>= 0x7f800000 means the chunk holds inf/nan).
struct Stats {
  std::int32_t min_key;
  std::int32_t max_key;
  std::uint32_t max_abs_bits;
};
Stats chunk_stats(const float* in, std::size_t n);
std::uint32_t max_abs_bits(const float* in, std::size_t n);

// q = round((x - mid) * inv_step + 127.5) clamped to [0, 255]; y = mid + (q - 127.5) * step.
// (Centred so no intermediate overflows even when max - min exceeds FLT_MAX.)
void encode_affine8(const float* in, std::size_t n, float mid, float inv_step, std::uint8_t* out);
void decode_affine8(const std::uint8_t* in, std::size_t n, float mid, float step, float* out,
                    bool acc, float w);
// Symmetric: q = round(x * inv_scale) clamped to [-127, 127] (int8) or [-7, 7] (nibble q+8);
// y = q * scale. Byte -128 and nibble 0 decode as -127 and -7.
void encode_sym8(const float* in, std::size_t n, float inv_scale, std::uint8_t* out);
void decode_sym8(const std::uint8_t* in, std::size_t n, float scale, float* out, bool acc, float w);
// n values into (n + 1) / 2 bytes; n must be even unless this is the tensor's last range
// (then the last high nibble is written as 0).
void encode_sym4(const float* in, std::size_t n, float inv_scale, std::uint8_t* out);
void decode_sym4(const std::uint8_t* in, std::size_t n, float scale, float* out, bool acc, float w);

// Quantile codec, one chunk: writes 256 codebook floats to `params` and n indices to `out`.
// The chunk must be finite (checked by the caller).
void encode_quantile_chunk(const float* in, std::size_t n, std::uint8_t* params, std::uint8_t* out);
void decode_quantile_chunk(const std::uint8_t* params, const std::uint8_t* in, std::size_t n,
                           float* out, bool acc, float w);

}  // namespace starling::averaging::detail
