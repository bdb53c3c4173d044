// Fashion-MNIST loading: gzip and IDX parsing, error reporting, normalisation, streams.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <fstream>
#include <set>

#include "starling/training/fashion_mnist.hpp"
#include "support/temp_dir.hpp"

using namespace starling;
using namespace starling::training;
namespace fs = std::filesystem;

namespace {

Bytes gzip(BytesView in) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  Bytes out(deflateBound(&zs, in.size()) + 64);
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

Bytes idx(std::uint8_t type, std::vector<std::uint32_t> dims, std::size_t data_bytes) {
  Bytes b{0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (auto d : dims) append_be32(b, d);
  for (std::size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<std::uint8_t>(i % 10));
  return b;
}

// Writes `b` to dir/name.
void write_file(const fs::path& dir, const std::string& name, BytesView b) {
  std::ofstream f(dir / name, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

bool have_dataset() {
  return fs::exists(fs::path(kFashionMnistDefaultDir) / "train-images-idx3-ubyte.gz");
}

}  // namespace

TEST(Gzip, RoundTripAndErrors) {
  Bytes data(100000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 7 % 251);
  Bytes gz = gzip(data);
  auto r = gunzip(gz, 1 << 20);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value(), data);

  // Two concatenated members are one stream.
  Bytes two = gz;
  two.insert(two.end(), gz.begin(), gz.end());
  auto r2 = gunzip(two, 1 << 20);
  ASSERT_TRUE(r2);
  EXPECT_EQ(r2.value().size(), 2 * data.size());

  for (std::size_t cut : {gz.size() - 1, gz.size() - 8, gz.size() / 2, std::size_t{12}}) {
    auto t = gunzip(BytesView(gz).first(cut), 1 << 20);
    ASSERT_FALSE(t) << cut;
    EXPECT_EQ(t.error(), errc::invalid_argument);
    EXPECT_NE(t.error().message().find("gzip"), std::string::npos);
  }
  auto truncated = gunzip(BytesView(gz).first(gz.size() / 2), 1 << 20);
  EXPECT_NE(truncated.error().message().find("truncated"), std::string::npos)
      << truncated.error().message();

  Bytes corrupt = gz;
  for (std::size_t i = 20; i < 40; ++i) corrupt[i] ^= 0x5a;
  EXPECT_FALSE(gunzip(corrupt, 1 << 20));
  Bytes crc_bad = gz;
  crc_bad[crc_bad.size() - 6] ^= 1;  // CRC-32 in the trailer
  EXPECT_FALSE(gunzip(crc_bad, 1 << 20));
  Bytes garbage_tail = gz;
  garbage_tail.push_back(0x42);
  EXPECT_FALSE(gunzip(garbage_tail, 1 << 20));
  EXPECT_EQ(gunzip(gz, 1000).error(), errc::too_large);
  EXPECT_FALSE(gunzip(data, 1 << 20));  // not gzip
}

TEST(Idx, ParsesAndRejects) {
  auto ok = parse_idx_ubyte(idx(0x08, {3, 2, 2}, 12), 3);
  ASSERT_TRUE(ok) << ok.error().message();
  EXPECT_EQ(ok.value().dims, (std::vector<std::uint32_t>{3, 2, 2}));
  EXPECT_EQ(ok.value().data.size(), 12u);

  auto msg = [](BytesView b, std::size_t nd) {
    auto r = parse_idx_ubyte(b, nd);
    EXPECT_FALSE(r);
    return r ? std::string() : r.error().message();
  };
  Bytes bad_magic = idx(0x08, {3}, 3);
  bad_magic[0] = 0x1f;
  EXPECT_NE(msg(bad_magic, 1).find("bad magic"), std::string::npos);
  EXPECT_NE(msg(idx(0x0d, {3}, 12), 1).find("type"), std::string::npos);  // floats
  EXPECT_NE(msg(idx(0x08, {3, 2}, 6), 1).find("dimensions"), std::string::npos);
  EXPECT_NE(msg(idx(0x08, {3, 2, 2}, 11), 3).find("truncated"), std::string::npos);
  EXPECT_FALSE(parse_idx_ubyte(idx(0x08, {3, 2, 2}, 13), 3));
  EXPECT_FALSE(parse_idx_ubyte(Bytes{0, 0, 8, 3, 0, 0}, 3));  // header cut short
  EXPECT_EQ(parse_idx_ubyte(idx(0x08, {100000, 100000, 100000}, 0), 3).error(), errc::too_large);
}

TEST(Dataset, Validation) {
  auto images = parse_idx_ubyte(idx(0x08, {4, 2, 2}, 16), 3).value();
  auto labels = parse_idx_ubyte(idx(0x08, {4}, 4), 1).value();
  auto d = make_image_dataset(images, labels, 10);
  ASSERT_TRUE(d);
  EXPECT_EQ(d.value().size(), 4u);
  EXPECT_EQ(d.value().image_size(), 4u);
  auto fewer = parse_idx_ubyte(idx(0x08, {3}, 3), 1).value();
  EXPECT_FALSE(make_image_dataset(images, fewer, 10));
  EXPECT_FALSE(make_image_dataset(images, labels, 3));  // label 3 out of range
}

TEST(Dataset, MissingAndCorruptFilesGiveClearErrors) {
  test::TempDir dir("data");
  auto r = load_fashion_mnist(dir.path, Split::train);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::not_found);
  EXPECT_NE(r.error().message().find("dataset-fashion-mnist"), std::string::npos);
  EXPECT_NE(r.error().message().find("train-images-idx3-ubyte"), std::string::npos);

  // Truncated gzip.
  Bytes img = gzip(idx(0x08, {2, 28, 28}, 2 * 784));
  write_file(dir.path, "t10k-images-idx3-ubyte.gz", BytesView(img).first(img.size() - 10));
  write_file(dir.path, "t10k-labels-idx1-ubyte.gz", gzip(idx(0x08, {2}, 2)));
  r = load_fashion_mnist(dir.path, Split::test);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("corrupt"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("truncated"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("t10k-images"), std::string::npos) << r.error().message();

  // Well-formed files: loads. Uncompressed files are accepted too.
  write_file(dir.path, "t10k-images-idx3-ubyte.gz", img);
  r = load_fashion_mnist(dir.path, Split::test);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value().size(), 2u);
  fs::remove(dir.path / "t10k-labels-idx1-ubyte.gz");
  write_file(dir.path, "t10k-labels-idx1-ubyte", idx(0x08, {2}, 2));
  EXPECT_TRUE(load_fashion_mnist(dir.path, Split::test));

  // Image/label count mismatch.
  write_file(dir.path, "t10k-labels-idx1-ubyte", idx(0x08, {3}, 3));
  r = load_fashion_mnist(dir.path, Split::test);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("2 images but 3 labels"), std::string::npos);
}

TEST(Dataset, RealFashionMnist) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  auto train = load_fashion_mnist(kFashionMnistDefaultDir, Split::train);
  auto test = load_fashion_mnist(kFashionMnistDefaultDir, Split::test);
  ASSERT_TRUE(train) << train.error().message();
  ASSERT_TRUE(test) << test.error().message();
  // The dataset's published shape: 60,000 + 10,000 images of 28x28, balanced classes.
  EXPECT_EQ(train.value().size(), 60000u);
  EXPECT_EQ(test.value().size(), 10000u);
  EXPECT_EQ(train.value().rows, 28u);
  EXPECT_EQ(train.value().cols, 28u);
  std::vector<int> per_class(10);
  for (auto l : train.value().labels) ++per_class[l];
  for (int c : per_class) EXPECT_EQ(c, 6000);
  // The normalisation constants match the training pixels.
  double sum = 0, sq = 0;
  for (auto p : train.value().pixels) {
    double x = p / 255.0;
    sum += x;
    sq += x * x;
  }
  const double n = static_cast<double>(train.value().pixels.size());
  const double mean = sum / n, std = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, kFashionMnistMean, 1e-3);
  EXPECT_NEAR(std, kFashionMnistStd, 1e-3);
}

TEST(Normalize, MapsPixels) {
  std::vector<std::uint8_t> px{0, 255, 73};
  std::vector<float> out(3);
  normalize_pixels(px, out, 0.5f, 0.25f);
  EXPECT_NEAR(out[0], -2.0f, 1e-6);
  EXPECT_NEAR(out[1], 2.0f, 1e-6);
  EXPECT_NEAR(out[2], (73 / 255.0f - 0.5f) / 0.25f, 1e-5);
}

TEST(SampleStream, PassesArePermutationsAndSeedsDiffer) {
  constexpr std::size_t n = 1000;
  SampleStream a(n, 1), b(n, 2), a2(n, 1);
  std::vector<std::uint32_t> xa, xb, xa2;
  a.next(2 * n + 10, xa);
  b.next(n, xb);
  a2.next(2 * n + 10, xa2);
  EXPECT_EQ(xa, xa2);  // same seed, same stream
  EXPECT_EQ(a.pass(), 2u);
  EXPECT_EQ(a.position(), 10u);
  for (int pass = 0; pass < 2; ++pass) {
    std::set<std::uint32_t> s(xa.begin() + pass * n, xa.begin() + (pass + 1) * n);
    EXPECT_EQ(s.size(), n);
    EXPECT_EQ(*s.rbegin(), n - 1);
  }
  EXPECT_NE(std::vector<std::uint32_t>(xa.begin(), xa.begin() + n), xb);
  // Consecutive passes use different orders.
  EXPECT_NE(std::vector<std::uint32_t>(xa.begin(), xa.begin() + n),
            std::vector<std::uint32_t>(xa.begin() + n, xa.begin() + 2 * n));
  // Not the identity either: a decent shuffle moves almost everything.
  std::size_t fixed = 0;
  for (std::size_t i = 0; i < n; ++i) fixed += xa[i] == i;
  EXPECT_LT(fixed, 10u);
  // Resuming from a saved position continues the same sequence.
  SampleStream c(n, 1);
  c.seek(1, 500);
  std::vector<std::uint32_t> xc;
  c.next(n - 500 + 10, xc);  // to the end of pass 1 and 10 into pass 2
  EXPECT_EQ(xc, std::vector<std::uint32_t>(xa.begin() + n + 500, xa.end()));
  EXPECT_NE(seed_from_bytes(to_bytes("peer-a")), seed_from_bytes(to_bytes("peer-b")));
}
