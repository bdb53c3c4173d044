#include "starling/net/byte_stream.hpp"

#include <algorithm>
#include <cstring>

namespace starling::net {

awaitable<result<void>> read_exact(ByteStream& s, MutableBytesView buf) {
  std::size_t got = 0;
  while (got < buf.size()) {
    auto n = co_await s.read_some(buf.subspan(got));
    if (!n) co_return n.error();
    got += n.value();
  }
  co_return success();
}

awaitable<result<void>> BufferedReader::fill() {
  // Drop what was consumed (at most a partial varint or frame header remains), so the buffer
  // never grows with the bytes a long stream has carried.
  if (pos_ > 0) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
    pos_ = 0;
  }
  std::size_t old = buf_.size();
  buf_.resize(old + 4096);
  auto n = co_await s_->read_some(MutableBytesView(buf_).subspan(old));
  if (!n) {
    buf_.resize(old);
    co_return n.error();
  }
  buf_.resize(old + n.value());
  co_return success();
}

awaitable<result<std::uint64_t>> BufferedReader::read_uvarint() {
  for (;;) {
    auto d = decode_uvarint(BytesView(buf_).subspan(pos_));
    if (!d) co_return d.error();
    if (d.value()) {
      pos_ += d.value()->length;
      co_return d.value()->value;
    }
    ST_CO_TRY(co_await fill());
  }
}

awaitable<result<void>> BufferedReader::read_exact(MutableBytesView out) {
  std::size_t got = std::min(out.size(), buffered());
  if (got > 0) std::memcpy(out.data(), buf_.data() + pos_, got);
  pos_ += got;
  if (got < out.size()) {
    ST_CO_TRY(co_await net::read_exact(*s_, out.subspan(got)));
  }
  co_return success();
}

awaitable<result<Bytes>> BufferedReader::read_length_prefixed(std::size_t max_len) {
  ST_CO_TRY(auto len, co_await read_uvarint());
  if (len > max_len)
    co_return make_error(errc::too_large, "length prefix " + std::to_string(len) +
                                              " exceeds limit " + std::to_string(max_len));
  co_return co_await read_bytes(len);
}

awaitable<result<Bytes>> BufferedReader::read_bytes(std::size_t n) {
  constexpr std::size_t kStep = 64 * 1024;
  Bytes out;
  out.reserve(std::min(n, kStep));
  while (out.size() < n) {
    // Grow geometrically (at most twice what has arrived, plus one step).
    std::size_t chunk = std::min(n - out.size(), std::max(kStep, out.size()));
    std::size_t old = out.size();
    out.resize(old + chunk);
    auto r = co_await read_exact(MutableBytesView(out).subspan(old));
    if (!r) co_return r.error();
  }
  co_return out;
}

Bytes BufferedReader::take_buffered() {
  Bytes rest(buf_.begin() + static_cast<std::ptrdiff_t>(pos_), buf_.end());
  buf_.clear();
  pos_ = 0;
  return rest;
}

Bytes length_prefixed(BytesView payload) {
  Bytes out;
  out.reserve(payload.size() + uvarint_size(payload.size()));
  append_uvarint(out, payload.size());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

awaitable<result<void>> write_length_prefixed(ByteStream& s, BytesView payload) {
  auto framed = length_prefixed(payload);
  co_return co_await s.write(framed);
}

awaitable<result<void>> ByteStream::wait_readable() {
  co_return make_error(errc::unsupported, describe() + ": no buffered reads");
}

result<std::size_t> ByteStream::read_buffered(MutableBytesView) {
  return make_error(errc::unsupported, describe() + ": no buffered reads");
}

namespace {
class PrefixedStream final : public ByteStream {
 public:
  PrefixedStream(ByteStreamPtr inner, Bytes prefix)
      : inner_(std::move(inner)), prefix_(std::move(prefix)) {}
  awaitable<result<std::size_t>> read_some(MutableBytesView buf) override {
    if (pos_ < prefix_.size()) {
      std::size_t n = std::min(buf.size(), prefix_.size() - pos_);
      std::memcpy(buf.data(), prefix_.data() + pos_, n);
      pos_ += n;
      co_return n;
    }
    co_return co_await inner_->read_some(buf);
  }
  awaitable<result<void>> write(BytesView data) override { return inner_->write(data); }
  awaitable<result<void>> close_write() override { return inner_->close_write(); }
  void reset() override { inner_->reset(); }
  asio::any_io_executor get_executor() override { return inner_->get_executor(); }
  std::string describe() const override { return inner_->describe(); }
  bool buffered_reads() const override { return inner_->buffered_reads(); }
  awaitable<result<void>> wait_readable() override {
    if (pos_ < prefix_.size()) co_return success();
    co_return co_await inner_->wait_readable();
  }
  result<std::size_t> read_buffered(MutableBytesView buf) override {
    if (pos_ < prefix_.size()) {
      std::size_t n = std::min(buf.size(), prefix_.size() - pos_);
      std::memcpy(buf.data(), prefix_.data() + pos_, n);
      pos_ += n;
      return n;
    }
    return inner_->read_buffered(buf);
  }

 private:
  ByteStreamPtr inner_;
  Bytes prefix_;
  std::size_t pos_ = 0;
};
}  // namespace

ByteStreamPtr with_prefix(ByteStreamPtr inner, Bytes already_read) {
  if (already_read.empty()) return inner;
  return std::make_shared<PrefixedStream>(std::move(inner), std::move(already_read));
}

}  // namespace starling::net
