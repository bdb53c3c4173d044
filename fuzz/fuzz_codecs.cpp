// Fuzz target for the tensor codecs. The first byte picks the mode:
//   even: the rest is an untrusted encoded buffer; decode and decode_accumulate must either
//         reject it with errc::invalid_argument (leaving the accumulator untouched) or produce
//         finite values, and never read out of bounds;
//   odd:  the next two bytes pick a codec and chunk size and the rest is float32 input;
//         encode -> decode must hold the documented per-element error bound.
// Bit 1 of the mode byte sets allow_non_finite, bit 2 splits the work across a ThreadPool.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "starling/averaging/compression.hpp"
#include "starling/core/log.hpp"
#include "starling/core/thread_pool.hpp"

using namespace starling;
using namespace starling::averaging;

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

float f32_at(const Bytes& b, std::size_t off) {
  float f;
  std::memcpy(&f, b.data() + off, 4);
  return f;
}

void fuzz_decode(const std::uint8_t* data, std::size_t size, bool allow, ThreadPool* pool) {
  BytesView buf(data, size);
  DecodeOptions opt;
  opt.allow_non_finite = allow;
  opt.pool = pool;
  auto info = inspect(buf);
  std::size_t n = size % 97;  // some span size when the header is bad
  if (info) {
    if (info.value().count > (std::uint64_t{1} << 20)) return;  // a lie needing a huge buffer
    n = static_cast<std::size_t>(info.value().count);
  }
  std::vector<float> out(n, 0.0f);
  auto r = decode(buf, out, opt);
  if (!r) {
    check(r.error() == errc::invalid_argument);
  } else if (!allow) {
    for (float v : out) check(std::isfinite(v));
  }
  std::vector<float> acc(n, 1.0f);
  auto a = decode_accumulate(buf, acc, 0.5f, opt);
  check(static_cast<bool>(a) == static_cast<bool>(r));
  if (!a) {
    for (float v : acc) check(v == 1.0f);
  } else if (!allow) {
    for (float v : acc) check(std::isfinite(v));
  }
  // A span of the wrong size is always refused.
  if (info) {
    std::vector<float> wrong(n + 1);
    check(!decode(buf, wrong, opt));
  }
}

void fuzz_round_trip(const std::uint8_t* data, std::size_t size, bool allow, ThreadPool* pool) {
  if (size < 2) return;
  auto codec = static_cast<CodecId>(1 + data[0] % 7);
  auto block_log2 = static_cast<std::uint8_t>(kMinBlockLog2 + data[1] % 5);
  CodecSpec spec{codec, block_log2};
  std::size_t n = (size - 2) / 4;
  std::vector<float> x(n);
  if (n) std::memcpy(x.data(), data + 2, n * 4);
  EncodeOptions eo;
  eo.allow_non_finite = allow;
  eo.pool = pool;
  auto enc = encode(spec, x, eo);
  bool non_finite = std::any_of(x.begin(), x.end(), [](float v) { return !std::isfinite(v); });
  bool fp16_overflow = codec == CodecId::float16 && std::any_of(x.begin(), x.end(), [](float v) {
                         return std::isfinite(v) && std::fabs(v) >= 65520.0f;
                       });
  // bfloat16 rounds |x| >= 0x1.ffp127 up to inf (IEEE overflow).
  bool bf16_overflow = codec == CodecId::bfloat16 && std::any_of(x.begin(), x.end(), [](float v) {
                         return std::isfinite(v) && std::fabs(v) >= 0x1.ffp127f;
                       });
  bool must_fail = (is_chunked(codec) && non_finite) ||
                   (!allow && (non_finite || fp16_overflow || bf16_overflow));
  check(static_cast<bool>(enc) == !must_fail);
  if (!enc) return;
  const Bytes& b = enc.value();
  check(b.size() == encoded_size(spec, n));
  DecodeOptions dopt;
  dopt.allow_non_finite = allow;
  dopt.pool = pool;
  std::vector<float> y(n);
  check(static_cast<bool>(decode(b, y, dopt)));

  std::size_t bs = spec.block_size() ? spec.block_size() : std::max<std::size_t>(n, 1);
  auto info = inspect(b).value();
  for (std::size_t i = 0; i < n; ++i) {
    double xv = x[i], yv = y[i];
    if (std::isnan(xv)) {
      check(std::isnan(yv));
      continue;
    }
    if (std::isinf(xv)) {
      check(yv == xv);
      continue;
    }
    std::size_t c = i / bs, b0 = c * bs, b1 = std::min(n, b0 + bs);
    double lo = x[b0], hi = x[b0], a = 0;
    for (std::size_t j = b0; j < b1; ++j) {
      lo = std::min<double>(lo, x[j]);
      hi = std::max<double>(hi, x[j]);
      a = std::max(a, std::fabs(static_cast<double>(x[j])));
    }
    double v = std::fabs(xv), err = std::fabs(yv - xv), lim = 0;
    constexpr double kFloor = 0x1p-140;
    switch (codec) {
      case CodecId::none:
        check(std::bit_cast<std::uint32_t>(x[i]) == std::bit_cast<std::uint32_t>(y[i]));
        continue;
      case CodecId::float16:
        if (v >= 65520.0) {  // allowed overflow
          check(std::isinf(yv) && std::signbit(yv) == std::signbit(xv));
          continue;
        }
        lim = v >= 0x1p-14 ? 0x1p-11 * v : 0x1p-25;
        break;
      case CodecId::bfloat16:
        if (v >= 0x1.ffp127) {  // allowed overflow
          check(std::isinf(yv) && std::signbit(yv) == std::signbit(xv));
          continue;
        }
        lim = v >= 0x1p-126 ? 0x1p-8 * v : 0x1p-134;
        break;
      case CodecId::uniform8:
        lim = (hi - lo) / 510 + 0x1p-20 * std::max(std::fabs(lo), std::fabs(hi)) + kFloor;
        break;
      case CodecId::blockwise8:
        lim = a / 254 + 0x1p-20 * a + kFloor;
        break;
      case CodecId::blockwise4:
        lim = a / 14 + 0x1p-20 * a + kFloor;
        break;
      case CodecId::quantile8: {
        std::size_t cb = info.params_offset + c * 1024;
        int q = b[info.payload_offset + i];
        double cv = f32_at(b, cb + 4 * q);
        double below = q > 0 ? f32_at(b, cb + 4 * (q - 1)) : lo;
        double above = q < 255 ? f32_at(b, cb + 4 * (q + 1)) : hi;
        check(yv == cv);
        lim = std::max(cv - below, above - cv);
        break;
      }
    }
    check(err <= lim);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool quiet = (set_log_level("off"), true);
  static ThreadPool pool(2);
  (void)quiet;
  if (size < 1) return 0;
  std::uint8_t mode = data[0];
  bool allow = mode & 2;
  ThreadPool* p = (mode & 4) ? &pool : nullptr;
  if (mode & 1) {
    fuzz_round_trip(data + 1, size - 1, allow, p);
  } else {
    fuzz_decode(data + 1, size - 1, allow, p);
  }
  return 0;
}
