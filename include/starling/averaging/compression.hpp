// Tensor compression for decentralized averaging: codecs that turn a span of float32 into a
// self-describing byte buffer and back (or add it, weighted, into an accumulator).
//
// Threading rule: the functions are pure and reentrant; they touch only their arguments.
// With options.pool set, the work is split across that ThreadPool (the calling thread takes
// part); the *_async variants run everything on the pool and resume the caller's coroutine
// on its own executor, so a node's I/O thread never does the arithmetic.
//
// Codecs and their error bounds (x = input value, y = decoded value; see docs/compression.md):
//   none       float32, exact (bit for bit).
//   float16    IEEE binary16, round to nearest even. |x| >= 2^-14: |y-x| <= 2^-11 |x|;
//              |x| < 2^-14 (half subnormals): |y-x| <= 2^-25. |x| >= 65520 becomes +-inf.
//   bfloat16   round to nearest even. normal x: |y-x| <= 2^-8 |x|; subnormal x: <= 2^-134.
//   uniform8   per chunk mid = (min+max)/2, step = (max-min)/255, q = round((x-mid)/step
//              + 127.5), y = mid + (q-127.5) step:
//              |y-x| <= step/2 + 2^-20 max(|min|, |max|) + 2^-140 (the last term only
//              matters when step is subnormal).
//   quantile8  per chunk 256 bins with equal counts (edges are quantiles of a strided
//              sample of up to 2048 chunk values), each value sent as its bin index and
//              decoded to the mean of its bin. With c the 256 decoded values of the chunk and
//              c[-1] = chunk min, c[256] = chunk max, a value sent as index b satisfies
//              |y-x| <= max(c[b]-c[b-1], c[b+1]-c[b]). Typical error: docs/compression.md.
//   blockwise8 per block a = max|x|, q = round(127 x / a) in [-127, 127]:
//              |y-x| <= a/254 + 2^-20 a + 2^-140.
//   blockwise4 per block a = max|x|, q = round(7 x / a) in [-7, 7], two values a byte:
//              |y-x| <= a/14 + 2^-20 a + 2^-140.
//
// Non-finite values: by default encode() rejects input containing inf/nan (and values that
// round to inf: |x| >= 65520 for float16, >= 0x1.ffp127 for bfloat16) with
// errc::invalid_argument, and decode() rejects buffers whose float
// payload holds inf/nan. With allow_non_finite the float codecs carry inf/nan through
// (nan stays nan, inf stays inf); the quantizing codecs always reject non-finite input.
//
// Wire form (all integers and floats little-endian):
//   u8 codec id | u8 version (1) | u8 block_log2 | u8 flags (0) | u64 element count
//   | per-chunk parameters | payload
// block_log2 is 0 for none/float16/bfloat16 and in [6, 24] for the chunked codecs; the last
// chunk may be short. Parameters per chunk: uniform8 f32 mid, f32 step; quantile8 256 x f32
// (non-decreasing); blockwise8/4 f32 absmax. Payload: none 4 bytes a value, float16/bfloat16
// 2, uniform8/quantile8 1 (u8), blockwise8 1 (i8), blockwise4 one byte per pair (low nibble =
// even index, stored as q+8; an odd count leaves the last high nibble 0). The decoder checks
// every field and that the buffer size is exactly what the header implies; anything else is
// errc::invalid_argument and nothing outside the buffer is read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "starling/core/async.hpp"
#include "starling/core/bytes.hpp"
#include "starling/core/result.hpp"

namespace starling {
class ThreadPool;
}

namespace starling::averaging {

enum class CodecId : std::uint8_t {
  none = 1,
  float16 = 2,
  bfloat16 = 3,
  uniform8 = 4,
  quantile8 = 5,
  blockwise8 = 6,
  blockwise4 = 7,
};

std::string_view to_string(CodecId c);
std::optional<CodecId> codec_from_string(std::string_view name);
// True for uniform8, quantile8, blockwise8, blockwise4 (codecs with per-chunk parameters).
bool is_chunked(CodecId c);
// The chunk size used when CodecSpec::block_log2 is 0 (log2): uniform8 12, quantile8 16,
// blockwise8 12, blockwise4 9; 0 for the float codecs.
std::uint8_t default_block_log2(CodecId c);

inline constexpr std::uint8_t kMinBlockLog2 = 6;   // 64 values
inline constexpr std::uint8_t kMaxBlockLog2 = 24;  // 16 Mi values
inline constexpr std::uint8_t kWireVersion = 1;
inline constexpr std::size_t kHeaderSize = 12;
// Largest element count the wire form allows (keeps every size computation far from
// overflow); decode() additionally requires the count to equal the output span's size.
inline constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 40;

// Which codec, and for chunked codecs the chunk size.
struct CodecSpec {
  CodecId codec = CodecId::none;
  std::uint8_t block_log2 = 0;  // 0: default_block_log2(codec); ignored by float codecs

  // The chunk size actually used (0 for float codecs).
  std::size_t block_size() const;
  friend bool operator==(const CodecSpec&, const CodecSpec&) = default;
};

struct EncodeOptions {
  bool allow_non_finite = false;  // see the header comment
  ThreadPool* pool = nullptr;     // split the work across this pool (nullptr: caller only)
};

struct DecodeOptions {
  bool allow_non_finite = false;  // accept inf/nan in float16/bfloat16/none payloads
  ThreadPool* pool = nullptr;
};

// Size of the buffer encode() produces for `count` values (the spec must be valid).
std::size_t encoded_size(const CodecSpec& spec, std::size_t count);

// Encodes `in` into `out`, which must have exactly encoded_size(spec, in.size()) bytes.
// Errors: errc::invalid_argument (bad spec, wrong out size, non-finite input).
result<void> encode_into(const CodecSpec& spec, std::span<const float> in, MutableBytesView out,
                         const EncodeOptions& options = {});
result<Bytes> encode(const CodecSpec& spec, std::span<const float> in,
                     const EncodeOptions& options = {});

// What a buffer's header says, after checking the header and the total size (but not the
// parameter values or payload: decode() does that).
struct EncodedInfo {
  CodecSpec spec;
  std::uint64_t count = 0;
  std::size_t block_size = 0;  // 0 for float codecs
  std::size_t chunks = 0;      // number of parameter sets (0 for float codecs)
  std::size_t params_offset = 0;
  std::size_t payload_offset = 0;
  std::size_t total_size = 0;
};
result<EncodedInfo> inspect(BytesView buf);

// Decodes `buf` into `out` (out.size() must equal the element count). Any malformed buffer is
// errc::invalid_argument; on error `out` may have been partly written.
result<void> decode(BytesView buf, std::span<float> out, const DecodeOptions& options = {});
// out[i] += weight * decoded[i]. The whole buffer is validated before `out` is touched, so on
// error `out` is unchanged.
result<void> decode_accumulate(BytesView buf, std::span<float> out, float weight,
                               const DecodeOptions& options = {});

// The same on `pool` (options.pool is set to it). The spans must stay valid until the await
// completes; cancellation before the work starts yields errc::cancelled.
awaitable<result<Bytes>> encode_async(ThreadPool& pool, CodecSpec spec, std::span<const float> in,
                                      EncodeOptions options = {});
awaitable<result<void>> decode_async(ThreadPool& pool, BytesView buf, std::span<float> out,
                                     DecodeOptions options = {});
awaitable<result<void>> decode_accumulate_async(ThreadPool& pool, BytesView buf,
                                                std::span<float> out, float weight,
                                                DecodeOptions options = {});

// Chooses a codec per tensor: explicit overrides by tensor index first, then by size.
// Defaults: up to 4096 values float32 (exact; tiny tensors such as biases and norms cost
// nothing), up to 65536 float16, larger blockwise8 (about 4.01x smaller than float32).
struct CompressionPolicy {
  std::size_t small_max = std::size_t{1} << 12;
  CodecSpec small{CodecId::none};
  std::size_t medium_max = std::size_t{1} << 16;
  CodecSpec medium{CodecId::float16};
  CodecSpec large{CodecId::blockwise8};
  // When the size rule picks float16 but some finite value is beyond float16's range
  // (|x| >= 65520), use this codec instead (bfloat16 keeps float32's range).
  CodecSpec float16_overflow{CodecId::bfloat16};
  std::map<std::size_t, CodecSpec> per_tensor;  // tensor index -> codec

  // By size only (and overrides).
  CodecSpec choose(std::size_t tensor_index, std::size_t count) const;
  // By size, then the float16 range check on `data`.
  CodecSpec choose(std::size_t tensor_index, std::span<const float> data) const;
};

// Error feedback for one tensor: adds the previous round's compression error (residual) to
// the input before encoding and keeps the new error, so quantization error is sent in later
// rounds instead of being lost; the running mean of what peers decode converges to the
// running mean of the inputs. Not thread-safe; one instance per tensor.
class ErrorFeedback {
 public:
  // Encodes input + residual and sets residual = (input + residual) - decode(encoded).
  // A size change resets the residual to zero. On error the residual is unchanged.
  result<Bytes> encode(const CodecSpec& spec, std::span<const float> input,
                       const EncodeOptions& options = {});
  std::span<const float> residual() const { return residual_; }
  void reset() { residual_.clear(); }

 private:
  std::vector<float> residual_;
  std::vector<float> corrected_;
  std::vector<float> decoded_;
};

}  // namespace starling::averaging
