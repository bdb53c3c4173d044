// Byte buffers for the yamux session that grow without zero-filling and keep their capacity
// for reuse: OutBuffer (frames queued for the connection) and ByteQueue (a stream's received,
// unread bytes). Single-threaded, like the session that owns them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "starling/core/bytes.hpp"

namespace starling::net::yamux {

// Append-only buffer; clear() keeps the capacity.
class OutBuffer {
 public:
  // Extends the buffer by `n` bytes and returns a pointer to them (uninitialized).
  std::uint8_t* grow(std::size_t n) {
    if (cap_ - size_ < n) reserve(std::max(size_ + n, cap_ * 2));
    std::uint8_t* p = data_.get() + size_;
    size_ += n;
    return p;
  }
  void reserve(std::size_t cap) {
    if (cap <= cap_) return;
    auto d = std::make_unique_for_overwrite<std::uint8_t[]>(cap);
    if (size_) std::memcpy(d.get(), data_.get(), size_);
    data_ = std::move(d);
    cap_ = cap;
  }
  void clear() noexcept { size_ = 0; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  std::uint8_t* data() noexcept { return data_.get(); }
  BytesView view() const noexcept { return {data_.get(), size_}; }
  std::size_t capacity() const noexcept { return cap_; }

 private:
  std::unique_ptr<std::uint8_t[]> data_;
  std::size_t size_ = 0;
  std::size_t cap_ = 0;
};

// FIFO of bytes in one contiguous block: append at the tail, pop from the head.
class ByteQueue {
 public:
  std::size_t size() const noexcept { return tail_ - head_; }
  bool empty() const noexcept { return head_ == tail_; }
  void append(const std::uint8_t* p, std::size_t n) {
    if (cap_ - tail_ < n) make_room(n);
    std::memcpy(data_.get() + tail_, p, n);
    tail_ += n;
  }
  std::size_t pop(std::uint8_t* out, std::size_t n) noexcept {
    n = std::min(n, size());
    std::memcpy(out, data_.get() + head_, n);
    head_ += n;
    if (head_ == tail_) head_ = tail_ = 0;
    return n;
  }
  // Releases memory (used when a stream can receive nothing more).
  void release() noexcept {
    data_.reset();
    cap_ = head_ = tail_ = 0;
  }

 private:
  void make_room(std::size_t n) {
    const std::size_t live = size();
    if (head_ > 0 && cap_ - live >= n && live <= cap_ / 2) {
      std::memmove(data_.get(), data_.get() + head_, live);  // compact
    } else {
      const std::size_t cap = std::max({live + n, cap_ * 2, std::size_t{16 * 1024}});
      auto d = std::make_unique_for_overwrite<std::uint8_t[]>(cap);
      if (live) std::memcpy(d.get(), data_.get() + head_, live);
      data_ = std::move(d);
      cap_ = cap;
    }
    head_ = 0;
    tail_ = live;
  }

  std::unique_ptr<std::uint8_t[]> data_;
  std::size_t cap_ = 0, head_ = 0, tail_ = 0;
};

}  // namespace starling::net::yamux
