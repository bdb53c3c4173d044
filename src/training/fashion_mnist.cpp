// Fashion-MNIST loading: gzip, IDX, validation, normalisation, shuffled sample streams.
#include "starling/training/fashion_mnist.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "starling/core/log.hpp"

namespace starling::training {
namespace {

constexpr std::uint8_t kGzipMagic0 = 0x1f;
constexpr std::uint8_t kGzipMagic1 = 0x8b;
constexpr std::uint8_t kIdxUbyte = 0x08;
// Largest compressed file we read; Fashion-MNIST's biggest is ~26 MiB.
constexpr std::size_t kMaxFileBytes = 256u << 20;
// Largest inflated file: the training images are 47,040,016 bytes.
constexpr std::size_t kMaxInflatedBytes = 128u << 20;

bool is_gzip(BytesView in) {
  return in.size() >= 2 && in[0] == kGzipMagic0 && in[1] == kGzipMagic1;
}

std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias (rejection sampling on the top of the range).
std::uint64_t bounded(std::mt19937_64& rng, std::uint64_t bound) {
  const std::uint64_t limit =
      std::numeric_limits<std::uint64_t>::max() - std::numeric_limits<std::uint64_t>::max() % bound;
  std::uint64_t v;
  do {
    v = rng();
  } while (v >= limit);
  return v % bound;
}

}  // namespace

result<Bytes> gunzip(BytesView in, std::size_t max_out) {
  if (!is_gzip(in)) return make_error(errc::invalid_argument, "not a gzip stream (bad magic)");
  Bytes out;
  out.reserve(std::min<std::size_t>(max_out, in.size() * 4));
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK)
    return make_error(errc::internal, "gzip: inflateInit2 failed");
  struct Guard {
    z_stream* z;
    ~Guard() { inflateEnd(z); }
  } guard{&zs};
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in =
      static_cast<uInt>(std::min<std::size_t>(in.size(), std::numeric_limits<uInt>::max()));
  std::size_t fed = zs.avail_in;
  std::uint8_t chunk[1 << 16];
  for (;;) {
    zs.next_out = chunk;
    zs.avail_out = sizeof chunk;
    int rc = inflate(&zs, Z_NO_FLUSH);
    std::size_t produced = sizeof chunk - zs.avail_out;
    if (out.size() + produced > max_out)
      return make_error(errc::too_large,
                        fmt::format("gzip: inflates to more than {} bytes", max_out));
    out.insert(out.end(), chunk, chunk + produced);
    if (zs.avail_in == 0 && fed < in.size()) {
      std::size_t more = std::min<std::size_t>(in.size() - fed, std::numeric_limits<uInt>::max());
      zs.next_in = const_cast<Bytef*>(in.data() + fed);
      zs.avail_in = static_cast<uInt>(more);
      fed += more;
    }
    if (rc == Z_STREAM_END) {
      std::size_t rest = zs.avail_in + (in.size() - fed);
      if (rest == 0) return out;
      // A concatenated member may follow; anything else is garbage.
      BytesView tail = in.subspan(in.size() - rest);
      if (!is_gzip(tail))
        return make_error(errc::invalid_argument,
                          fmt::format("gzip: {} bytes of trailing garbage", rest));
      if (inflateReset(&zs) != Z_OK) return make_error(errc::internal, "gzip: inflateReset");
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && fed == in.size())
      return make_error(
          errc::invalid_argument,
          fmt::format("gzip: truncated (stream ends after {} input bytes)", in.size()));
    return make_error(errc::invalid_argument,
                      fmt::format("gzip: corrupt stream ({})", zs.msg ? zs.msg : zError(rc)));
  }
}

result<Bytes> read_maybe_gzip(const std::filesystem::path& path, std::size_t max_out) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return make_error(errc::not_found, fmt::format("{}: no such file", path.string()));
  auto size = std::filesystem::file_size(path, ec);
  if (ec) return make_error(errc::io, fmt::format("{}: {}", path.string(), ec.message()));
  if (size > kMaxFileBytes)
    return make_error(errc::too_large,
                      fmt::format("{}: {} bytes is too large", path.string(), size));
  std::ifstream f(path, std::ios::binary);
  if (!f)
    return make_error(errc::io,
                      fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
  Bytes raw(size);
  f.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(size));
  if (static_cast<std::size_t>(f.gcount()) != size)
    return make_error(errc::io, fmt::format("{}: short read", path.string()));
  if (!is_gzip(raw)) {
    if (raw.size() > max_out)
      return make_error(errc::too_large,
                        fmt::format("{}: larger than {} bytes", path.string(), max_out));
    return raw;
  }
  auto r = gunzip(raw, max_out);
  if (!r) return r.error().with_context(path.string());
  return r;
}

result<IdxArray> parse_idx_ubyte(BytesView in, std::size_t expected_ndims) {
  if (in.size() < 4) return make_error(errc::invalid_argument, "idx: shorter than its magic");
  if (in[0] != 0 || in[1] != 0)
    return make_error(errc::invalid_argument, fmt::format("idx: bad magic {:02x}{:02x}{:02x}{:02x}",
                                                          in[0], in[1], in[2], in[3]));
  if (in[2] != kIdxUbyte)
    return make_error(errc::invalid_argument,
                      fmt::format("idx: element type 0x{:02x} is not unsigned byte (0x08)", in[2]));
  std::size_t ndims = in[3];
  if (ndims != expected_ndims)
    return make_error(errc::invalid_argument,
                      fmt::format("idx: {} dimensions, expected {}", ndims, expected_ndims));
  if (in.size() < 4 + 4 * ndims) return make_error(errc::invalid_argument, "idx: truncated header");
  IdxArray a;
  std::uint64_t total = 1;
  for (std::size_t i = 0; i < ndims; ++i) {
    std::uint32_t d = load_be32(in.data() + 4 + 4 * i);
    a.dims.push_back(d);
    total *= d;
    if (total > kMaxInflatedBytes)
      return make_error(errc::too_large,
                        fmt::format("idx: dims describe more than {} bytes", kMaxInflatedBytes));
  }
  std::size_t header = 4 + 4 * ndims;
  std::size_t have = in.size() - header;
  if (have != total)
    return make_error(errc::invalid_argument,
                      fmt::format("idx: dims describe {} bytes of data but the file has {}{}",
                                  total, have, have < total ? " (truncated)" : ""));
  a.data.assign(in.begin() + static_cast<std::ptrdiff_t>(header), in.end());
  return a;
}

result<ImageDataset> make_image_dataset(IdxArray images, IdxArray labels, std::size_t num_classes) {
  if (images.dims.size() != 3 || labels.dims.size() != 1)
    return make_error(errc::invalid_argument, "dataset: images need 3 dims and labels 1");
  if (images.dims[0] != labels.dims[0])
    return make_error(errc::invalid_argument, fmt::format("dataset: {} images but {} labels",
                                                          images.dims[0], labels.dims[0]));
  if (images.dims[0] == 0) return make_error(errc::invalid_argument, "dataset: no images");
  if (images.dims[1] == 0 || images.dims[2] == 0)
    return make_error(errc::invalid_argument, "dataset: empty image shape");
  for (std::size_t i = 0; i < labels.data.size(); ++i)
    if (labels.data[i] >= num_classes)
      return make_error(errc::invalid_argument,
                        fmt::format("dataset: label {} of sample {} is out of range (classes: {})",
                                    labels.data[i], i, num_classes));
  ImageDataset d;
  d.rows = images.dims[1];
  d.cols = images.dims[2];
  d.pixels = std::move(images.data);
  d.labels = std::move(labels.data);
  return d;
}

result<ImageDataset> load_fashion_mnist(const std::filesystem::path& dir, Split split) {
  const char* prefix = split == Split::train ? "train" : "t10k";
  auto find = [&](const std::string& stem) -> std::filesystem::path {
    std::filesystem::path gz = dir / (stem + ".gz");
    std::error_code ec;
    if (!std::filesystem::exists(gz, ec) && std::filesystem::exists(dir / stem, ec))
      return dir / stem;
    return gz;
  };
  auto images_path = find(fmt::format("{}-images-idx3-ubyte", prefix));
  auto labels_path = find(fmt::format("{}-labels-idx1-ubyte", prefix));
  auto load = [&](const std::filesystem::path& p, std::size_t ndims) -> result<IdxArray> {
    auto raw = read_maybe_gzip(p, kMaxInflatedBytes);
    if (!raw) {
      if (raw.error() == errc::not_found)
        return raw.error().with_context(
            "Fashion-MNIST is missing (install the Debian package dataset-fashion-mnist, or "
            "point --data-dir at a directory holding the four *-ubyte.gz files)");
      return raw.error().with_context("Fashion-MNIST is corrupt");
    }
    auto arr = parse_idx_ubyte(raw.value(), ndims);
    if (!arr)
      return arr.error().with_context(fmt::format("Fashion-MNIST is corrupt: {}", p.string()));
    return arr;
  };
  ST_TRY(auto images, load(images_path, 3));
  ST_TRY(auto labels, load(labels_path, 1));
  auto d = make_image_dataset(std::move(images), std::move(labels), kFashionMnistClasses);
  if (!d) return d.error().with_context(fmt::format("Fashion-MNIST is corrupt ({})", dir.string()));
  logger("optim")->debug("loaded Fashion-MNIST {}: {} images of {}x{}", prefix, d.value().size(),
                         d.value().rows, d.value().cols);
  return d;
}

void normalize_pixels(std::span<const std::uint8_t> in, std::span<float> out, float mean,
                      float std) {
  const float scale = 1.0f / (255.0f * std);
  const float shift = mean / std;
  const std::size_t n = std::min(in.size(), out.size());
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]) * scale - shift;
}

SampleStream::SampleStream(std::size_t n, std::uint64_t seed) : n_(n), seed_(seed) {
  if (n_ > 0) shuffle_pass();
}

void SampleStream::shuffle_pass() {
  order_.resize(n_);
  for (std::size_t i = 0; i < n_; ++i) order_[i] = static_cast<std::uint32_t>(i);
  std::uint64_t s = seed_ ^ (pass_ * 0xd1b54a32d192ed03ull);
  std::seed_seq seq{splitmix64(s), splitmix64(s), splitmix64(s), splitmix64(s)};
  std::mt19937_64 rng(seq);
  for (std::size_t i = n_; i > 1; --i) std::swap(order_[i - 1], order_[bounded(rng, i)]);
}

void SampleStream::next(std::size_t count, std::vector<std::uint32_t>& out) {
  if (n_ == 0) return;
  while (count > 0) {
    if (position_ == n_) {
      ++pass_;
      position_ = 0;
      shuffle_pass();
    }
    std::size_t take = std::min<std::size_t>(count, n_ - position_);
    out.insert(out.end(), order_.begin() + static_cast<std::ptrdiff_t>(position_),
               order_.begin() + static_cast<std::ptrdiff_t>(position_ + take));
    position_ += take;
    count -= take;
  }
}

void SampleStream::seek(std::uint64_t pass, std::uint64_t position) {
  if (n_ == 0) return;
  bool reshuffle = pass != pass_;
  pass_ = pass;
  position_ = std::min<std::uint64_t>(position, n_);
  if (reshuffle) shuffle_pass();
}

std::uint64_t seed_from_bytes(BytesView b) {
  // FNV-1a, then one splitmix64 round to spread it.
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (auto c : b) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return splitmix64(h);
}

}  // namespace starling::training
