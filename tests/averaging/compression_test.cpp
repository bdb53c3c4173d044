// Tests of the tensor codecs: stated error bounds on many input shapes, exact float16 /
// bfloat16 rounding against independent references, special values, decode-accumulate, the
// thread pool paths, error feedback and the policy. Wire validation: compression_wire_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <asio/io_context.hpp>

#include "averaging/compression_test_support.hpp"
#include "starling/averaging/compression.hpp"
#include "starling/core/log.hpp"
#include "starling/core/thread_pool.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::averaging;

using namespace starling::averaging::test_support;

TEST(Compression, Names) {
  for (CodecId c : kAll) EXPECT_EQ(codec_from_string(to_string(c)), c);
  EXPECT_EQ(codec_from_string("float32"), CodecId::none);
  EXPECT_FALSE(codec_from_string("zstd"));
}

TEST(Compression, EveryCodecWithinItsBound) {
  for (const auto& spec : specs()) {
    for (const auto& c : cases()) {
      bool fp16_overflow = spec.codec == CodecId::float16 && max_abs(c.data) >= 65520;
      auto enc = encode(spec, c.data);
      if (fp16_overflow) {  // documented: beyond float16 range is an error by default
        ASSERT_FALSE(enc) << c.name;
        EXPECT_EQ(enc.error(), errc::invalid_argument);
        continue;
      }
      ASSERT_TRUE(enc) << c.name << " " << to_string(spec.codec) << ": " << enc.error().message();
      EXPECT_EQ(enc.value().size(), encoded_size(spec, c.data.size()));
      std::vector<float> y(c.data.size(), kNan);
      auto dec = decode(enc.value(), y);
      ASSERT_TRUE(dec) << c.name << " " << to_string(spec.codec) << ": " << dec.error().message();
      EXPECT_EQ(check_bound(spec, c.data, y, enc.value(), c.name), 0);
      for (float v : y) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

TEST(Compression, ConstantAndZeroInputsAreExactForQuantizedCodecs) {
  for (CodecId codec : kQuantized) {
    for (float v : {0.0f, 3.25f, -0.5f}) {
      std::vector<float> x(1000, v), y(1000);
      ASSERT_TRUE(decode(encode({codec}, x).value(), y));
      // uniform8 and quantile8 reproduce a constant exactly; blockwise codecs up to the
      // rounding of absmax / 127 (or / 7).
      bool exact = codec == CodecId::uniform8 || codec == CodecId::quantile8 || v == 0.0f;
      for (float d : y) {
        if (exact)
          ASSERT_EQ(d, v) << to_string(codec);
        else
          ASSERT_NEAR(d, v, 1e-6 * std::fabs(v)) << to_string(codec);
      }
    }
  }
}

TEST(Compression, CompressionRatios) {
  std::size_t n = std::size_t{1} << 20;
  EXPECT_EQ(encoded_size({CodecId::none}, n), 12 + 4 * n);
  EXPECT_EQ(encoded_size({CodecId::float16}, n), 12 + 2 * n);
  EXPECT_EQ(encoded_size({CodecId::blockwise8}, n), 12 + 4 * (n / 4096) + n);
  EXPECT_EQ(encoded_size({CodecId::blockwise4}, n), 12 + 4 * (n / 512) + n / 2);
  EXPECT_EQ(encoded_size({CodecId::uniform8}, n), 12 + 8 * (n / 4096) + n);
  EXPECT_EQ(encoded_size({CodecId::quantile8}, n), 12 + 1024 * (n / 65536) + n);
  EXPECT_EQ(encoded_size({CodecId::blockwise4}, 3), 12 + 4 + 2);
  EXPECT_EQ(encoded_size({CodecId::blockwise8, 5}, 10), 0u);  // invalid spec
}

TEST(Compression, QuantileErrorOnNormalData) {
  auto x = normal(1 << 18, 11);
  std::vector<float> y(x.size());
  ASSERT_TRUE(decode(encode({CodecId::quantile8}, x).value(), y));
  double se = 0, sx = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    se += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    sx += double(x[i]) * x[i];
  }
  // Documented in docs/compression.md: about 2.8% of the RMS for normal data, almost all of
  // it from the two outermost bins, which hold the tails (beyond +-2.66 sigma).
  EXPECT_LT(std::sqrt(se / sx), 0.035);
}

// ---- float16 / bfloat16 rounding against independent references ----

namespace {
double half_value(std::uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}
// Nearest finite half (ties to even mantissa) by search over all positive finite halves.
std::uint16_t reference_f16(float x) {
  double a = std::fabs(static_cast<double>(x));
  std::uint16_t best = 0;
  int lo = 0, hi = 0x7bff;
  while (lo < hi) {  // first half >= a
    int mid = (lo + hi) / 2;
    if (half_value(static_cast<std::uint16_t>(mid)) < a)
      lo = mid + 1;
    else
      hi = mid;
  }
  best = static_cast<std::uint16_t>(lo);
  if (lo > 0) {
    double up = half_value(static_cast<std::uint16_t>(lo)) - a;
    double down = a - half_value(static_cast<std::uint16_t>(lo - 1));
    if (down < up || (down == up && (lo - 1) % 2 == 0)) best = static_cast<std::uint16_t>(lo - 1);
  }
  if (a > 65504) best = a >= 65520 ? 0x7c00 : 0x7bff;
  return static_cast<std::uint16_t>(best | (std::signbit(x) ? 0x8000 : 0));
}
std::uint16_t reference_bf16(float x) {
  auto bits = std::bit_cast<std::uint32_t>(x);
  std::uint32_t down = bits >> 16, up = down + 1;
  double a = std::fabs(static_cast<double>(x));
  double dv = std::fabs(static_cast<double>(std::bit_cast<float>(down << 16)));
  double uv = std::fabs(static_cast<double>(std::bit_cast<float>(up << 16)));
  if ((up & 0x7f80) == 0x7f80) uv = std::ldexp(1.0, 128);  // rounding up gives inf
  if (a - dv < uv - a || (a - dv == uv - a && down % 2 == 0))
    return static_cast<std::uint16_t>(down);
  return static_cast<std::uint16_t>(up);
}
std::uint16_t encoded16(CodecId c, float x) {
  EncodeOptions o;
  o.allow_non_finite = true;
  auto b = encode({c}, std::span<const float>(&x, 1), o).value();
  return static_cast<std::uint16_t>(b[12] | (b[13] << 8));
}
}  // namespace

TEST(Compression, Float16MatchesReferenceRounding) {
  std::mt19937 g(21);
  std::vector<float> xs = {0.0f,       -0.0f,        1.0f,     65504.0f,        65519.99f,
                           65520.0f,   -65520.0f,    0x1p-24f, 0x1p-25f,        0x1.8p-24f,
                           0x1p-14f,   0x1.ffcp-15f, 1e-45f,   3.0f * 0x1p-25f, 0x1.002p0f,
                           0x1.006p0f, 1e-8f};
  for (int i = 0; i < 200000; ++i) {
    auto bits = static_cast<std::uint32_t>(g());
    float x = std::bit_cast<float>(bits);
    if (!std::isfinite(x) || x == 0.0f) continue;
    // Keep most samples near the half range where rounding is interesting.
    if (i % 2)
      x = std::ldexp(std::fabs(x) / std::ldexp(1.0f, std::ilogb(x)), int(bits % 44) - 28) *
          (bits & 1 ? -1.0f : 1.0f);
    xs.push_back(x);
  }
  int bad = 0;
  for (float x : xs) {
    std::uint16_t got = encoded16(CodecId::float16, x), want = reference_f16(x);
    if (got != want && bad++ < 5)
      ADD_FAILURE() << std::hexfloat << x << " got " << got << " want " << want;
#ifdef __FLT16_MANT_DIG__
    auto hw = std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));
    if (got != hw && bad++ < 5)
      ADD_FAILURE() << std::hexfloat << x << " got " << got << " _Float16 " << hw;
#endif
  }
  EXPECT_EQ(bad, 0);
}

TEST(Compression, Float16DecodesEveryCode) {
  // A buffer holding all 65536 codes (nan/inf allowed).
  Bytes buf(12 + 2 * 65536);
  buf[0] = static_cast<std::uint8_t>(CodecId::float16);
  buf[1] = 1;
  buf[6] = 1;  // count = 65536
  for (std::uint32_t h = 0; h < 65536; ++h) {
    buf[12 + 2 * h] = static_cast<std::uint8_t>(h);
    buf[13 + 2 * h] = static_cast<std::uint8_t>(h >> 8);
  }
  std::vector<float> y(65536);
  DecodeOptions o;
  o.allow_non_finite = true;
  ASSERT_TRUE(decode(buf, y, o));
  for (std::uint32_t h = 0; h < 65536; ++h) {
    int e = (h >> 10) & 31;
    if (e == 31) {
      if (h & 1023)
        ASSERT_TRUE(std::isnan(y[h])) << h;
      else
        ASSERT_EQ(y[h], (h & 0x8000) ? -kInf : kInf);
    } else {
      ASSERT_EQ(static_cast<double>(y[h]), half_value(static_cast<std::uint16_t>(h))) << h;
      ASSERT_EQ(std::signbit(y[h]), (h & 0x8000) != 0);
    }
  }
  EXPECT_FALSE(decode(buf, y));  // by default inf/nan in the payload is rejected
}

TEST(Compression, BFloat16MatchesReferenceRounding) {
  std::mt19937 g(22);
  std::vector<float> xs = {0.0f,    -0.0f,    1.0f,   0x1.008p0f, 0x1.018p0f,
                           FLT_MAX, -FLT_MAX, 1e-45f, 0x1.fep127f};
  for (int i = 0; i < 200000; ++i)
    xs.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(g())));
  int bad = 0;
  for (float x : xs) {
    if (std::isnan(x)) continue;
    std::uint16_t got = encoded16(CodecId::bfloat16, x);
    std::uint16_t want = std::isinf(x)
                             ? static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x) >> 16)
                             : reference_bf16(x);
    if (got != want && bad++ < 5)
      ADD_FAILURE() << std::hexfloat << x << " got " << got << " want " << want;
  }
  EXPECT_EQ(bad, 0);
}

// ---- special values ----

TEST(Compression, NonFiniteInputRejectedByDefault) {
  for (CodecId c : kAll) {
    for (float bad : {kInf, -kInf, kNan}) {
      auto x = normal(5000, 30);
      x[4321] = bad;
      auto r = encode({c}, x);
      ASSERT_FALSE(r) << to_string(c);
      EXPECT_EQ(r.error(), errc::invalid_argument);
      EncodeOptions allow;
      allow.allow_non_finite = true;
      auto r2 = encode({c}, x, allow);
      EXPECT_EQ(static_cast<bool>(r2), !is_chunked(c)) << to_string(c);
    }
  }
}

TEST(Compression, FloatCodecsCarryNonFiniteWhenAllowed) {
  EncodeOptions eo;
  eo.allow_non_finite = true;
  DecodeOptions dopt;
  dopt.allow_non_finite = true;
  std::vector<float> x = {kInf, -kInf, kNan, -kNan, 1.0f, -0.0f, 70000.0f, -1e30f};
  for (CodecId c : {CodecId::none, CodecId::float16, CodecId::bfloat16}) {
    auto enc = encode({c}, x, eo);
    ASSERT_TRUE(enc);
    std::vector<float> y(x.size());
    ASSERT_TRUE(decode(enc.value(), y, dopt));
    EXPECT_EQ(y[0], kInf);
    EXPECT_EQ(y[1], -kInf);
    EXPECT_TRUE(std::isnan(y[2]));
    EXPECT_TRUE(std::isnan(y[3]));
    EXPECT_EQ(y[4], 1.0f);
    EXPECT_TRUE(y[5] == 0.0f && std::signbit(y[5]));
    if (c == CodecId::float16) {
      EXPECT_EQ(y[6], kInf);  // overflow rounds to inf (IEEE)
      EXPECT_EQ(y[7], -kInf);
    }
    EXPECT_FALSE(decode(enc.value(), y)) << "default decode rejects inf/nan payload";
  }
  // float16 overflow alone (no inf/nan in the input) is an error by default.
  std::vector<float> big = {65519.0f, 65520.0f};
  EXPECT_FALSE(encode({CodecId::float16}, big));
  big.pop_back();
  EXPECT_TRUE(encode({CodecId::float16}, big));
}

TEST(Compression, AccumulateRejectsNonFinitePayloadWithoutTouchingOutput) {
  EncodeOptions eo;
  eo.allow_non_finite = true;
  for (CodecId c : {CodecId::none, CodecId::float16, CodecId::bfloat16}) {
    auto x = normal(70000, 31);
    x[69000] = kNan;
    auto enc = encode({c}, x, eo).value();
    std::vector<float> acc(x.size(), 2.0f);
    auto r = decode_accumulate(enc, acc, 0.5f);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), errc::invalid_argument);
    for (float v : acc) ASSERT_EQ(v, 2.0f);
  }
}

// ---- accumulate, pool, async ----

TEST(Compression, DecodeAccumulateMatchesDecode) {
  for (CodecId c : kAll) {
    auto x = normal(10000 + 17, 60);
    auto enc = encode({c}, x).value();
    std::vector<float> d(x.size()), acc = uniform(x.size(), 61, -1, 1), expect = acc;
    ASSERT_TRUE(decode(enc, d));
    ASSERT_TRUE(decode_accumulate(enc, acc, 0.25f));
    for (std::size_t i = 0; i < x.size(); ++i) ASSERT_FLOAT_EQ(acc[i], expect[i] + 0.25f * d[i]);
  }
}

TEST(Compression, AccumulatingPeersGivesTheMean) {
  std::vector<std::vector<float>> peers = {normal(5000, 70), normal(5000, 71), normal(5000, 72)};
  for (CodecId c : kAll) {
    std::vector<float> mean(5000, 0.0f);
    std::vector<double> decoded_sum(5000, 0.0), exact(5000, 0.0);
    double err_sum = 0;  // sum over peers of w * (that peer's worst decode error)
    for (auto& p : peers) {
      auto enc = encode({c}, p).value();
      ASSERT_TRUE(decode_accumulate(enc, mean, 1.0f / 3));
      std::vector<float> d(p.size());
      ASSERT_TRUE(decode(enc, d));
      double worst = 0;
      for (std::size_t i = 0; i < p.size(); ++i) {
        decoded_sum[i] += d[i] / 3.0;
        exact[i] += p[i] / 3.0;
        worst = std::max(worst, std::fabs(double(d[i]) - p[i]));
      }
      err_sum += worst / 3;
    }
    for (std::size_t i = 0; i < mean.size(); ++i) {
      ASSERT_NEAR(mean[i], decoded_sum[i], 1e-5) << to_string(c);
      ASSERT_LE(std::fabs(mean[i] - exact[i]), err_sum + 1e-5) << to_string(c);
    }
  }
}

TEST(Compression, PoolGivesIdenticalResults) {
  ThreadPool pool(3);
  auto x = normal(300000 + 11, 80);
  for (CodecId c : kAll) {
    EncodeOptions eo;
    eo.pool = &pool;
    auto serial = encode({c}, x).value();
    auto parallel = encode({c}, x, eo).value();
    ASSERT_EQ(serial, parallel) << to_string(c);
    std::vector<float> a(x.size()), b(x.size());
    DecodeOptions dopt;
    dopt.pool = &pool;
    ASSERT_TRUE(decode(serial, a));
    ASSERT_TRUE(decode(serial, b, dopt));
    ASSERT_EQ(a, b);
    ASSERT_TRUE(decode_accumulate(serial, b, -1.0f, dopt));
    for (float v : b) ASSERT_EQ(v, 0.0f);
  }
}

TEST(Compression, AsyncRunsOnPoolAndResumesOnIoThread) {
  ThreadPool pool(2);
  asio::io_context io;
  auto x = normal(100000, 90);
  test::run_with_deadline(
      io,
      [&]() -> awaitable<void> {
        auto enc = co_await encode_async(pool, {CodecId::blockwise8}, x);
        EXPECT_TRUE(enc);
        if (!enc) co_return;
        std::vector<float> y(x.size()), acc(x.size(), 0.0f);
        EXPECT_TRUE(co_await decode_async(pool, enc.value(), y));
        EXPECT_TRUE(co_await decode_accumulate_async(pool, enc.value(), acc, 2.0f));
        for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(acc[i], 2.0f * y[i]);
        std::vector<float> wrong(5);
        auto bad = co_await decode_async(pool, enc.value(), wrong);
        EXPECT_FALSE(bad);
      },
      30s);
}

// ---- error feedback ----

TEST(ErrorFeedback, RemovesBiasOfCraftedInput) {
  // One large value per 64-value block makes 4-bit quantization round 0.05 to 0 every round:
  // without feedback the receiver's mean is stuck at 0, with feedback it converges to 0.05.
  CodecSpec spec{CodecId::blockwise4, 6};
  std::vector<float> x(256, 0.05f);
  for (std::size_t i = 0; i < x.size(); i += 64) x[i] = 1.0f;
  ErrorFeedback ef;
  std::vector<double> sum_ef(x.size()), sum_plain(x.size());
  std::vector<float> y(x.size());
  const int rounds = 2000;
  for (int r = 0; r < rounds; ++r) {
    ASSERT_TRUE(decode(ef.encode(spec, x).value(), y));
    for (std::size_t i = 0; i < x.size(); ++i) sum_ef[i] += y[i];
    ASSERT_TRUE(decode(encode(spec, x).value(), y));
    for (std::size_t i = 0; i < x.size(); ++i) sum_plain[i] += y[i];
  }
  double worst_ef = 0, worst_plain = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    worst_ef = std::max(worst_ef, std::fabs(sum_ef[i] / rounds - x[i]));
    worst_plain = std::max(worst_plain, std::fabs(sum_plain[i] / rounds - x[i]));
  }
  EXPECT_GT(worst_plain, 0.04);
  EXPECT_LT(worst_ef, 1e-3);
}

TEST(ErrorFeedback, RunningMeanConvergesOnRandomInputs) {
  // sum(decoded) = sum(inputs) - residual_R, so the running-mean gap shrinks like 1/R.
  for (CodecId c : kQuantized) {
    // quantile8 needs chunks well above 256 values to be lossy at all.
    CodecSpec spec{c, static_cast<std::uint8_t>(c == CodecId::quantile8 ? 10 : 8)};
    ErrorFeedback ef;
    std::vector<double> sum_in(1000), sum_out(1000);
    std::vector<float> y(1000);
    double gap10 = 0, gap1000 = 0;
    for (int r = 1; r <= 1000; ++r) {
      auto x = normal(1000, 100 + static_cast<std::uint32_t>(r));
      for (auto& v : x) v += 0.3f;  // a bias that plain quantization noise does not hide
      ASSERT_TRUE(decode(ef.encode(spec, x).value(), y));
      double gap = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        sum_in[i] += x[i];
        sum_out[i] += y[i];
        gap = std::max(gap, std::fabs(sum_in[i] - sum_out[i]) / r);
      }
      if (r == 10) gap10 = gap;
      if (r == 1000) gap1000 = gap;
    }
    EXPECT_LT(gap1000, gap10 / 20) << to_string(c);
    EXPECT_LT(gap1000, 2e-3) << to_string(c);
  }
}

TEST(ErrorFeedback, ResetsOnSizeChangeAndKeepsResidualOnError) {
  ErrorFeedback ef;
  ASSERT_TRUE(ef.encode({CodecId::blockwise8}, normal(100, 1)));
  auto before = std::vector<float>(ef.residual().begin(), ef.residual().end());
  EXPECT_EQ(before.size(), 100u);
  auto bad = normal(100, 2);
  bad[3] = kNan;
  EXPECT_FALSE(ef.encode({CodecId::blockwise8}, bad));
  EXPECT_TRUE(std::equal(before.begin(), before.end(), ef.residual().begin()));
  ASSERT_TRUE(ef.encode({CodecId::blockwise8}, normal(50, 3)));
  EXPECT_EQ(ef.residual().size(), 50u);
}

// ---- policy ----

TEST(CompressionPolicy, ChoosesBySizeWithOverrides) {
  CompressionPolicy p;
  EXPECT_EQ(p.choose(0, 1).codec, CodecId::none);
  EXPECT_EQ(p.choose(0, 4096).codec, CodecId::none);
  EXPECT_EQ(p.choose(0, 4097).codec, CodecId::float16);
  EXPECT_EQ(p.choose(0, 65536).codec, CodecId::float16);
  EXPECT_EQ(p.choose(0, 65537).codec, CodecId::blockwise8);
  p.per_tensor[3] = {CodecId::quantile8, 12};
  EXPECT_EQ(p.choose(3, 10), (CodecSpec{CodecId::quantile8, 12}));
  EXPECT_EQ(p.choose(4, 10).codec, CodecId::none);
  p.small_max = 0;
  p.medium = {CodecId::bfloat16};
  p.large = {CodecId::blockwise4};
  EXPECT_EQ(p.choose(0, 1).codec, CodecId::bfloat16);
  EXPECT_EQ(p.choose(0, 1 << 20).codec, CodecId::blockwise4);
}

TEST(CompressionPolicy, Float16OverflowFallsBackToBFloat16) {
  CompressionPolicy p;
  auto x = normal(10000, 5);
  EXPECT_EQ(p.choose(0, x).codec, CodecId::float16);
  x[17] = 70000.0f;
  EXPECT_EQ(p.choose(0, x).codec, CodecId::bfloat16);
  EXPECT_TRUE(encode(p.choose(0, x), x));
  x[17] = -65520.0f;
  EXPECT_EQ(p.choose(0, x).codec, CodecId::bfloat16);
  x[17] = 65519.0f;
  EXPECT_EQ(p.choose(0, x).codec, CodecId::float16);
  x[17] = kInf;  // non-finite is encode()'s business
  EXPECT_EQ(p.choose(0, x).codec, CodecId::float16);
}
