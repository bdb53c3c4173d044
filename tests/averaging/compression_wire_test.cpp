// Tests of the codecs' wire validation: every header field, truncation, counts, parameter
// values and random corruption of buffers that come from untrusted peers.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "averaging/compression_test_support.hpp"
#include "starling/averaging/compression.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace starling::averaging::test_support;

// ---- wire validation ----

namespace {
Bytes valid(CodecId c, std::size_t n = 300, std::uint8_t block_log2 = 6) {
  return encode({c, block_log2}, normal(n, 40)).value();
}
void expect_rejected(const Bytes& b, std::size_t n, const char* what) {
  std::vector<float> y(n, 1.0f);
  auto r = decode(b, y);
  EXPECT_FALSE(r) << what;
  if (!r) {
    EXPECT_EQ(r.error(), errc::invalid_argument) << what;
  }
  std::vector<float> acc(n, 1.0f);
  EXPECT_FALSE(decode_accumulate(b, acc, 1.0f)) << what;
  for (float v : acc) ASSERT_EQ(v, 1.0f) << what;
}
void set_f32(Bytes& b, std::size_t off, float f) {
  std::memcpy(b.data() + off, &f, 4);
}
}  // namespace

TEST(CompressionWire, HeaderRejections) {
  QuietLog quiet;
  expect_rejected({}, 0, "empty");
  expect_rejected(Bytes(11, 0), 0, "short header");
  for (CodecId c : kAll) {
    Bytes ok = valid(c);
    std::vector<float> y(300);
    ASSERT_TRUE(decode(ok, y)) << to_string(c);
    for (std::uint8_t id : {0, 8, 255}) {
      Bytes b = ok;
      b[0] = id;
      expect_rejected(b, 300, "codec id");
    }
    Bytes b = ok;
    b[1] = 2;
    expect_rejected(b, 300, "version");
    b = ok;
    b[3] = 1;
    expect_rejected(b, 300, "flags");
    b = ok;
    b[2] = is_chunked(c) ? 5 : 6;
    expect_rejected(b, 300, "block_log2");
    if (is_chunked(c)) {
      b[2] = 25;
      expect_rejected(b, 300, "block_log2 25");
    }
    // Every truncation and an extra byte.
    for (std::size_t len = 0; len < ok.size(); ++len)
      expect_rejected(Bytes(ok.begin(), ok.begin() + static_cast<std::ptrdiff_t>(len)), 300,
                      "truncated");
    b = ok;
    b.push_back(0);
    expect_rejected(b, 300, "trailing byte");
    // Counts that disagree with the size or the output span, and absurd counts.
    std::vector<float> y2(299);
    EXPECT_FALSE(decode(ok, y2));
    for (std::uint64_t count :
         {std::uint64_t{301}, std::uint64_t{1} << 40, (std::uint64_t{1} << 40) + 1,
          std::uint64_t{1} << 62, ~std::uint64_t{0}}) {
      b = ok;
      for (int i = 0; i < 8; ++i) b[4 + i] = static_cast<std::uint8_t>(count >> (8 * i));
      expect_rejected(b, 300, "count");
      EXPECT_FALSE(inspect(b));
    }
  }
}

TEST(CompressionWire, ParameterRejections) {
  QuietLog quiet;
  std::size_t p = kHeaderSize;
  for (CodecId c : {CodecId::blockwise8, CodecId::blockwise4}) {
    for (float bad : {kNan, kInf, -kInf, -1.0f}) {
      Bytes b = valid(c);
      set_f32(b, p + 4 * 2, bad);  // third block's absmax
      expect_rejected(b, 300, "absmax");
    }
  }
  {
    // An absmax whose decoded extreme (127 * (a / 127)) would overflow is refused, and the
    // encoder never produces one.
    Bytes b = valid(CodecId::blockwise8);
    set_f32(b, p, FLT_MAX);
    std::vector<float> y(300);
    auto r = decode(b, y);
    if (r) {
      for (float v : y) ASSERT_TRUE(std::isfinite(v));
    }
    for (CodecId c : {CodecId::blockwise8, CodecId::blockwise4, CodecId::uniform8}) {
      std::vector<float> x = {FLT_MAX, -FLT_MAX, 1.0f, 0.5f * FLT_MAX};
      auto enc = encode({c}, x);
      ASSERT_TRUE(enc);
      std::vector<float> out(x.size());
      ASSERT_TRUE(decode(enc.value(), out)) << to_string(c);
      for (std::size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(std::isfinite(out[i]));
        double lim = bound({c}, x, i);
        EXPECT_LE(std::fabs(double(out[i]) - x[i]), lim) << to_string(c) << " " << i;
      }
    }
  }
  for (auto [lo, step] : {std::pair{kNan, 0.1f},
                          {0.0f, kNan},
                          {kInf, 0.1f},
                          {0.0f, -0.1f},
                          {-FLT_MAX, kInf},
                          {FLT_MAX / 2, FLT_MAX / 200},
                          {-FLT_MAX, 1e36f}}) {
    Bytes b = valid(CodecId::uniform8);
    set_f32(b, p + 8, lo);
    set_f32(b, p + 12, step);
    expect_rejected(b, 300, "uniform range");
  }
  {
    Bytes b = valid(CodecId::quantile8, 300, 6);
    std::size_t cb = p + 1024 * 1;  // second chunk's codebook
    Bytes c1 = b;
    float v5;
    std::memcpy(&v5, c1.data() + cb + 20, 4);
    set_f32(c1, cb + 24, v5 - 1.0f);  // entry 6 < entry 5
    expect_rejected(c1, 300, "unsorted codebook");
    Bytes c2 = b;
    set_f32(c2, cb + 4 * 255, kNan);
    expect_rejected(c2, 300, "nan codebook");
  }
  {
    Bytes b = valid(CodecId::blockwise4, 301);
    std::vector<float> y(301);
    ASSERT_TRUE(decode(b, y));
    b.back() |= 0x10;
    expect_rejected(b, 301, "padding nibble");
  }
  {
    // Unused codes decode within the block's range: int8 -128 as -127, nibble 0 as -7.
    Bytes b = valid(CodecId::blockwise8, 64);
    auto info = inspect(b).value();
    float a = payload_f32(b, info.params_offset);
    b[info.payload_offset] = 0x80;
    std::vector<float> y(64);
    ASSERT_TRUE(decode(b, y));
    EXPECT_FLOAT_EQ(y[0], -a);
    Bytes b4 = valid(CodecId::blockwise4, 64);
    auto info4 = inspect(b4).value();
    float a4 = payload_f32(b4, info4.params_offset);
    b4[info4.payload_offset] = 0x00;
    ASSERT_TRUE(decode(b4, y));
    EXPECT_FLOAT_EQ(y[0], -a4);
    EXPECT_FLOAT_EQ(y[1], -a4);
  }
  std::vector<float> acc(300);
  EXPECT_FALSE(decode_accumulate(valid(CodecId::none), acc, kNan));
}

TEST(CompressionWire, RandomCorruptionNeverCrashes) {
  QuietLog quiet;
  std::mt19937 g(50);
  int accepted = 0, rejected = 0;
  for (CodecId c : kAll) {
    Bytes ok = valid(c, 333);
    for (int round = 0; round < 400; ++round) {
      Bytes b = ok;
      int flips = 1 + static_cast<int>(g() % 4);
      for (int f = 0; f < flips; ++f) b[g() % b.size()] = static_cast<std::uint8_t>(g());
      if (g() % 5 == 0) b.resize(g() % (b.size() + 8), 0x5a);
      std::vector<float> y(333);
      auto r = decode(b, y);
      if (r) {
        ++accepted;
        for (float v : y) ASSERT_TRUE(std::isfinite(v)) << to_string(c);
      } else {
        ++rejected;
        EXPECT_EQ(r.error(), errc::invalid_argument);
      }
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}
