// Fashion-MNIST for the built-in training task: gzip + IDX file parsing with clear errors,
// normalisation, and the per-peer shuffled sample stream. No torch here (the tensors are made
// in fashion_task.hpp), so this header is cheap to include.
//
// Threading rule: plain values and pure functions; a SampleStream belongs to one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "starling/core/bytes.hpp"

namespace starling::training {

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";
inline constexpr std::size_t kFashionMnistClasses = 10;
// Mean and standard deviation of the training images' pixels scaled to [0, 1] (a test checks
// them against the data).
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// Inflates a gzip member. Errors (errc::invalid_argument): not gzip, corrupt, truncated (the
// stream ends before its trailer), output over `max_out` bytes (errc::too_large).
result<Bytes> gunzip(BytesView in, std::size_t max_out);

// Reads a file; if it starts with the gzip magic it is inflated (at most `max_out` bytes).
// errc::not_found if it does not exist, errc::io if it cannot be read.
result<Bytes> read_maybe_gzip(const std::filesystem::path& path, std::size_t max_out);

// An IDX array of unsigned bytes (type code 0x08): dims and row-major data.
struct IdxArray {
  std::vector<std::uint32_t> dims;
  Bytes data;
};
// Parses IDX (magic 00 00 08 <ndims>, big-endian u32 dims, data). Rejects other type codes,
// a dimension count other than `expected_ndims`, and data shorter or longer than the dims.
result<IdxArray> parse_idx_ubyte(BytesView in, std::size_t expected_ndims);

// One split of the dataset: `size()` images of rows x cols pixels (uint8, row-major) and
// their labels (0..9).
struct ImageDataset {
  std::uint32_t rows = 0;
  std::uint32_t cols = 0;
  Bytes pixels;  // size() * rows * cols
  Bytes labels;  // size()
  std::size_t size() const noexcept { return labels.size(); }
  std::size_t image_size() const noexcept { return std::size_t{rows} * cols; }
};

enum class Split { train, test };

// Loads `<dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz` (or the same names without
// .gz). Errors name the file and the reason: missing (with the package to install), bad
// magic, truncated gzip, image/label count mismatch, labels out of range.
result<ImageDataset> load_fashion_mnist(const std::filesystem::path& dir, Split split);

// Validates an already parsed pair (used by load_fashion_mnist; exposed for tests).
result<ImageDataset> make_image_dataset(IdxArray images, IdxArray labels, std::size_t num_classes);

// (pixel / 255 - mean) / std for each pixel.
void normalize_pixels(std::span<const std::uint8_t> in, std::span<float> out,
                      float mean = kFashionMnistMean, float std = kFashionMnistStd);

// An endless stream of sample indices in [0, n): each pass over the data is a fresh
// permutation drawn from (seed, pass), so peers with different seeds see different orders and
// a peer that restarts with the same seed and position resumes the same order.
class SampleStream {
 public:
  SampleStream(std::size_t n, std::uint64_t seed);
  // Appends the next `count` indices to `out` (crossing into the next pass as needed).
  void next(std::size_t count, std::vector<std::uint32_t>& out);
  std::uint64_t pass() const noexcept { return pass_; }
  std::uint64_t position() const noexcept { return position_; }  // within the current pass
  // Jumps to (pass, position), e.g. after loading a checkpoint.
  void seek(std::uint64_t pass, std::uint64_t position);

 private:
  void shuffle_pass();
  std::size_t n_;
  std::uint64_t seed_;
  std::uint64_t pass_ = 0;
  std::uint64_t position_ = 0;
  std::vector<std::uint32_t> order_;
};

// A seed for SampleStream from a peer's identity bytes (so each peer's stream differs).
std::uint64_t seed_from_bytes(BytesView b);

}  // namespace starling::training
