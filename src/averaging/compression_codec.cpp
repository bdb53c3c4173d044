// encode / decode / decode_accumulate: per-unit dispatch to the kernels, optional splitting
// across a ThreadPool, and the async wrappers.
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "averaging/compression_kernels.hpp"
#include "starling/core/log.hpp"
#include "starling/core/thread_pool.hpp"

namespace starling::averaging {
namespace {

using namespace detail;

constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
// Values per parallel piece: large enough to amortise scheduling, small enough to balance.
constexpr std::size_t kGrainValues = std::size_t{1} << 16;
constexpr std::uint32_t kNonFiniteBits = 0x7f800000u;

// Runs fn(u0, u1) over [0, units), on the pool if there is one.
template <class Fn>
void for_units(ThreadPool* pool, const Layout& l, Fn&& fn) {
  std::size_t units = l.units();
  if (units == 0) return;
  if (!pool) {
    fn(std::size_t{0}, units);
    return;
  }
  std::size_t grain = std::max<std::size_t>(1, kGrainValues / l.unit_size());
  pool->parallel_for(0, units, grain, std::function<void(std::size_t, std::size_t)>(fn));
}

// Remembers the lowest failing unit across threads.
struct FirstBad {
  std::atomic<std::size_t> unit{kNone};
  void note(std::size_t u) {
    std::size_t cur = unit.load(std::memory_order_relaxed);
    while (u < cur && !unit.compare_exchange_weak(cur, u, std::memory_order_relaxed)) {
    }
  }
  bool any() const { return unit.load() != kNone; }
};

struct Range {
  std::size_t begin, n;
};
Range unit_range(const Layout& l, std::size_t u) {
  std::size_t b = u * l.unit_size();
  return {b, static_cast<std::size_t>(std::min<std::uint64_t>(l.unit_size(), l.count - b))};
}

bool normal_or_zero(float s) {
  return s == 0.0f || s >= FLT_MIN;
}

// Scalar fallbacks for chunks whose scale is subnormal.
void encode_affine8_exact(const float* in, std::size_t n, double mid, double step,
                          std::uint8_t* out) {
  for (std::size_t i = 0; i < n; ++i) {
    double q = step > 0 ? std::nearbyint((static_cast<double>(in[i]) - mid) / step + 127.5) : 0.0;
    out[i] = static_cast<std::uint8_t>(std::clamp(q, 0.0, 255.0));
  }
}
void encode_sym_exact(const float* in, std::size_t n, double scale, int limit, bool nibbles,
                      std::uint8_t* out) {
  for (std::size_t i = 0; i < n; ++i) {
    double q = scale > 0 ? std::nearbyint(static_cast<double>(in[i]) / scale) : 0.0;
    auto v =
        static_cast<int>(std::clamp(q, static_cast<double>(-limit), static_cast<double>(limit)));
    if (!nibbles) {
      out[i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(v));
    } else if (i % 2 == 0) {
      out[i / 2] = static_cast<std::uint8_t>(v + 8);
    } else {
      out[i / 2] = static_cast<std::uint8_t>(out[i / 2] | ((v + 8) << 4));
    }
  }
}

// Encodes one unit. Returns false if the input there cannot be encoded (non-finite).
bool encode_unit(const Layout& l, const float* in, std::uint8_t* buf, std::size_t u,
                 bool allow_non_finite) {
  auto [b, n] = unit_range(l, u);
  const float* x = in + b;
  std::uint8_t* payload = buf + l.payload_pos(b);
  std::uint8_t* params = buf + l.params_offset + u * l.param_bytes;
  switch (l.codec) {
    case CodecId::none:
      return encode_f32(x, n, payload) == 0 || allow_non_finite;
    case CodecId::float16:
      return encode_f16(x, n, payload) == 0 || allow_non_finite;
    case CodecId::bfloat16:
      return encode_bf16(x, n, payload) == 0 || allow_non_finite;
    case CodecId::uniform8: {
      Stats s = chunk_stats(x, n);
      if (s.max_abs_bits >= kNonFiniteBits) return false;
      double lo = from_order_key(s.min_key), hi = from_order_key(s.max_key);
      auto mid = static_cast<float>((lo + hi) / 2);
      auto step = static_cast<float>((hi - lo) / 255.0);
      // Keep the decoder's extremes mid +- 127.5 step finite (matters only near FLT_MAX).
      while (!std::isfinite(mid + 127.5f * step) || !std::isfinite(mid - 127.5f * step))
        step = std::nextafter(step, 0.0f);
      store_f32(params, mid);
      store_f32(params + 4, step);
      if (normal_or_zero(step)) {
        float inv = step > 0 ? static_cast<float>(1.0 / step) : 0.0f;
        encode_affine8(x, n, mid, inv, payload);
      } else {
        encode_affine8_exact(x, n, mid, step, payload);
      }
      return true;
    }
    case CodecId::blockwise8:
    case CodecId::blockwise4: {
      std::uint32_t ab = max_abs_bits(x, n);
      if (ab >= kNonFiniteBits) return false;
      float a = std::bit_cast<float>(ab);
      bool four = l.codec == CodecId::blockwise4;
      int limit = four ? 7 : 127;
      auto flimit = static_cast<float>(limit);
      // Near FLT_MAX, limit * (a / limit) can round up to inf, which decoders refuse.
      while (!std::isfinite(flimit * (a / flimit))) a = std::nextafter(a, 0.0f);
      float scale = a / flimit;  // what the decoder computes
      store_f32(params, a);
      if (normal_or_zero(scale)) {
        float inv = scale > 0 ? static_cast<float>(1.0 / scale) : 0.0f;
        if (four) {
          encode_sym4(x, n, inv, payload);
        } else {
          encode_sym8(x, n, inv, payload);
        }
      } else {
        encode_sym_exact(x, n, scale, limit, four, payload);
      }
      return true;
    }
    case CodecId::quantile8: {
      if (max_abs_bits(x, n) >= kNonFiniteBits) return false;
      encode_quantile_chunk(x, n, params, payload);
      return true;
    }
  }
  return false;
}

// Decodes one unit (parameters already validated). Returns false if a float payload held
// inf/nan (only reported when `check` is set).
bool decode_unit(const Layout& l, const std::uint8_t* buf, float* out, std::size_t u, bool acc,
                 float w, bool check) {
  auto [b, n] = unit_range(l, u);
  float* y = out + b;
  const std::uint8_t* payload = buf + l.payload_pos(b);
  const std::uint8_t* params = buf + l.params_offset + u * l.param_bytes;
  std::uint32_t bad = 0;
  switch (l.codec) {
    case CodecId::none:
      bad = decode_f32(payload, n, y, acc, w);
      break;
    case CodecId::float16:
      bad = decode_f16(payload, n, y, acc, w);
      break;
    case CodecId::bfloat16:
      bad = decode_bf16(payload, n, y, acc, w);
      break;
    case CodecId::uniform8:
      decode_affine8(payload, n, load_f32(params), load_f32(params + 4), y, acc, w);
      break;
    case CodecId::blockwise8:
      decode_sym8(payload, n, load_f32(params) / 127.0f, y, acc, w);
      break;
    case CodecId::blockwise4:
      decode_sym4(payload, n, load_f32(params) / 7.0f, y, acc, w);
      break;
    case CodecId::quantile8:
      decode_quantile_chunk(params, payload, n, y, acc, w);
      break;
  }
  return !(check && bad);
}

bool scan_unit(const Layout& l, const std::uint8_t* buf, std::size_t u) {
  auto [b, n] = unit_range(l, u);
  const std::uint8_t* payload = buf + l.payload_pos(b);
  switch (l.codec) {
    case CodecId::none:
      return check_f32(payload, n) == 0;
    case CodecId::float16:
      return check_f16(payload, n) == 0;
    case CodecId::bfloat16:
      return check_bf16(payload, n) == 0;
    default:
      return true;
  }
}

Error rejected(Error e) {
  logger("averaging")->warn("rejected {}", e.message());
  return e;
}

result<void> decode_impl(BytesView buf, std::span<float> out, bool acc, float w,
                         const DecodeOptions& opt) {
  auto lr = parse_layout(buf);
  if (!lr) return rejected(lr.error());
  const Layout& l = lr.value();
  if (l.count != out.size())
    return rejected(Error(
        errc::invalid_argument,
        fmt::format("compressed tensor: holds {} elements, expected {}", l.count, out.size())));
  if (auto v = validate_params(l, buf); !v) return rejected(v.error());
  if (acc && !std::isfinite(w))
    return Error(errc::invalid_argument, "decode_accumulate: weight is not finite");
  bool float_codec = !is_chunked(l.codec);
  bool check = float_codec && !opt.allow_non_finite;
  FirstBad bad;
  if (check && acc) {
    // Accumulation must not start before the whole payload is known to be finite.
    for_units(opt.pool, l, [&](std::size_t u0, std::size_t u1) {
      for (std::size_t u = u0; u < u1; ++u)
        if (!scan_unit(l, buf.data(), u)) bad.note(u);
    });
  } else {
    for_units(opt.pool, l, [&](std::size_t u0, std::size_t u1) {
      for (std::size_t u = u0; u < u1; ++u)
        if (!decode_unit(l, buf.data(), out.data(), u, acc, w, check)) bad.note(u);
    });
  }
  if (bad.any())
    return rejected(Error(errc::invalid_argument,
                          fmt::format("compressed tensor: {} payload holds inf/nan near element {}",
                                      to_string(l.codec), bad.unit.load() * l.unit_size())));
  if (check && acc) {
    for_units(opt.pool, l, [&](std::size_t u0, std::size_t u1) {
      for (std::size_t u = u0; u < u1; ++u)
        decode_unit(l, buf.data(), out.data(), u, true, w, false);
    });
  }
  return success();
}

}  // namespace

result<void> encode_into(const CodecSpec& spec, std::span<const float> in, MutableBytesView out,
                         const EncodeOptions& options) {
  ST_TRY(auto l, make_layout(spec, in.size()));
  if (out.size() != l.total)
    return Error(errc::invalid_argument, fmt::format("encode: output has {} bytes, {} needs {}",
                                                     out.size(), to_string(spec.codec), l.total));
  write_header(l, out.data());
  FirstBad bad;
  for_units(options.pool, l, [&](std::size_t u0, std::size_t u1) {
    for (std::size_t u = u0; u < u1; ++u)
      if (!encode_unit(l, in.data(), out.data(), u, options.allow_non_finite)) bad.note(u);
  });
  if (bad.any()) {
    const char* why =
        is_chunked(spec.codec) ? "inf/nan" : "inf/nan (or a value that rounds to inf)";
    return Error(
        errc::invalid_argument,
        fmt::format("encode {}: input holds {} in elements [{}, {})", to_string(spec.codec), why,
                    bad.unit.load() * l.unit_size(),
                    std::min<std::uint64_t>((bad.unit.load() + 1) * l.unit_size(), l.count)));
  }
  return success();
}

result<Bytes> encode(const CodecSpec& spec, std::span<const float> in,
                     const EncodeOptions& options) {
  ST_TRY(auto l, make_layout(spec, in.size()));
  Bytes out(l.total);
  ST_TRY(encode_into(spec, in, out, options));
  return out;
}

result<void> decode(BytesView buf, std::span<float> out, const DecodeOptions& options) {
  return decode_impl(buf, out, false, 1.0f, options);
}

result<void> decode_accumulate(BytesView buf, std::span<float> out, float weight,
                               const DecodeOptions& options) {
  return decode_impl(buf, out, true, weight, options);
}

awaitable<result<Bytes>> encode_async(ThreadPool& pool, CodecSpec spec, std::span<const float> in,
                                      EncodeOptions options) {
  options.pool = &pool;
  co_return co_await pool.run([=] { return encode(spec, in, options); });
}

awaitable<result<void>> decode_async(ThreadPool& pool, BytesView buf, std::span<float> out,
                                     DecodeOptions options) {
  options.pool = &pool;
  co_return co_await pool.run([=] { return decode(buf, out, options); });
}

awaitable<result<void>> decode_accumulate_async(ThreadPool& pool, BytesView buf,
                                                std::span<float> out, float weight,
                                                DecodeOptions options) {
  options.pool = &pool;
  co_return co_await pool.run([=] { return decode_accumulate(buf, out, weight, options); });
}

}  // namespace starling::averaging
