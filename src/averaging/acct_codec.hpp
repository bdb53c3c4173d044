// Fixed-width little-endian writer and bounds-checked reader for the accountability encodings
// (private to src/averaging/acct_*.cpp).
#pragma once

#include <array>
#include <bit>
#include <cstring>
#include <string>

#include "starling/core/bytes.hpp"
#include "starling/core/result.hpp"

namespace starling::averaging::acct {

struct Writer {
  Bytes out;
  void u8(std::uint8_t v) { out.push_back(v); }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void f64(double v) { u64(std::bit_cast<std::uint64_t>(v)); }
  void raw(BytesView b) { out.insert(out.end(), b.begin(), b.end()); }
  template <std::size_t N>
  void fixed(const std::array<std::uint8_t, N>& a) {
    out.insert(out.end(), a.begin(), a.end());
  }
};

// Reads past the end yield zeros and set `bad`; finish() reports it (and trailing bytes).
class Reader {
 public:
  explicit Reader(BytesView b) : b_(b) {}
  bool has(std::size_t n) const { return !bad_ && b_.size() - pos_ >= n; }
  std::uint8_t u8() {
    if (!take(1)) return 0;
    return b_[pos_ - 1];
  }
  std::uint32_t u32() {
    if (!take(4)) return 0;
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t{b_[pos_ - 4 + i]} << (8 * i);
    return v;
  }
  std::uint64_t u64() {
    if (!take(8)) return 0;
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{b_[pos_ - 8 + i]} << (8 * i);
    return v;
  }
  double f64() { return std::bit_cast<double>(u64()); }
  template <std::size_t N>
  void fixed(std::array<std::uint8_t, N>& a) {
    if (!take(N)) return;
    std::memcpy(a.data(), b_.data() + pos_ - N, N);
  }
  BytesView raw(std::size_t n) {
    if (!take(n)) return {};
    return b_.subspan(pos_ - n, n);
  }
  result<void> finish(const char* what) const {
    if (bad_) return make_error(errc::invalid_argument, std::string(what) + ": truncated");
    if (pos_ != b_.size())
      return make_error(errc::invalid_argument, std::string(what) + ": trailing bytes");
    return success();
  }
  Error fail(const std::string& why) const { return make_error(errc::invalid_argument, why); }

 private:
  bool take(std::size_t n) {
    if (!has(n)) {
      bad_ = true;
      return false;
    }
    pos_ += n;
    return true;
  }
  BytesView b_;
  std::size_t pos_ = 0;
  bool bad_ = false;
};

}  // namespace starling::averaging::acct
