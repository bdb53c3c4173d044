// NoiseStream: the transport phase of libp2p Noise (see noise_stream.hpp).
#include "net/noise_stream.hpp"

#include <algorithm>
#include <cstring>

#include "starling/core/log.hpp"

namespace starling::net {

namespace {
void store_be16(std::uint8_t* p, std::size_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 8);
  p[1] = static_cast<std::uint8_t>(v);
}
}  // namespace

NoiseStream::NoiseStream(ByteStreamPtr raw, noise::TransportCiphers ciphers,
                         std::string description)
    : raw_(std::move(raw)),
      describe_(std::move(description)),
      recv_(ciphers.recv),
      send_(ciphers.send) {}

NoiseStream::~NoiseStream() = default;

void NoiseStream::reset() {
  if (reset_) return;
  reset_ = true;
  raw_->reset();
}

Error NoiseStream::fail_read(Error e) {
  logger("net")->warn("{}: {}; resetting", describe_, e.message());
  read_error_ = e;
  reset();
  return e;
}

// ---- read side ----

result<std::size_t> NoiseStream::drain(MutableBytesView out) {
  std::size_t produced = 0;
  if (ppos_ < pend_) {
    std::size_t n = std::min(out.size(), pend_ - ppos_);
    std::memcpy(out.data(), rbuf_.data() + ppos_, n);
    ppos_ += n;
    produced = n;
  }
  while (produced < out.size()) {
    std::size_t avail = rend_ - rpos_;
    if (avail < 2) break;
    std::size_t len = load_be16(rbuf_.data() + rpos_);
    if (len < noise::kTagLen)
      return fail_read(make_error(
          errc::protocol_violation,
          "noise frame of " + std::to_string(len) + " bytes is shorter than its 16-byte tag"));
    if (avail < 2 + len) break;
    std::uint8_t* frame = rbuf_.data() + rpos_ + 2;
    std::size_t plain = len - noise::kTagLen;
    std::size_t room = out.size() - produced;
    if (plain <= room) {  // straight into the caller's buffer
      auto r = recv_.open(frame, len, out.data() + produced);
      if (!r) return fail_read(r.error());
      produced += plain;
      rpos_ += 2 + len;
      continue;
    }
    // Larger than what is left of the caller's buffer: decrypt in place, hand out a part.
    auto r = recv_.open(frame, len, frame);
    if (!r) return fail_read(r.error());
    ppos_ = rpos_ + 2;
    pend_ = ppos_ + plain;
    rpos_ += 2 + len;
    std::memcpy(out.data() + produced, rbuf_.data() + ppos_, room);
    ppos_ += room;
    produced += room;
  }
  return produced;
}

awaitable<result<void>> NoiseStream::fill() {
  // Only called with no plaintext pending, so everything before rpos_ is free.
  if (rpos_ == rend_) rpos_ = rend_ = 0;
  std::size_t avail = rend_ - rpos_;
  std::size_t frame = avail >= 2 ? 2 + load_be16(rbuf_.data() + rpos_) : 2;
  std::size_t want = std::max(frame, kMinReadBuffer);
  if (rpos_ > 0 && rbuf_.size() - rpos_ < want) {
    std::memmove(rbuf_.data(), rbuf_.data() + rpos_, avail);
    rpos_ = 0;
    rend_ = avail;
  }
  if (rbuf_.size() - rpos_ < want) rbuf_.resize(rpos_ + want);
  ppos_ = pend_ = 0;
  std::size_t space = rbuf_.size() - rend_;
  auto n = co_await raw_->read_some(MutableBytesView(rbuf_).subspan(rend_, space));
  if (!n) {
    if (reset_) co_return make_error(errc::reset, describe_ + " read: reset");
    if (n.error() == errc::closed) {
      if (rend_ > rpos_)
        co_return fail_read(make_error(errc::protocol_violation,
                                       "connection closed in the middle of a noise frame (" +
                                           std::to_string(rend_ - rpos_) + " bytes)"));
      read_error_ = make_error(errc::closed, describe_ + " read");
      co_return *read_error_;
    }
    co_return n.error().with_context(describe_ + " read");
  }
  rend_ += n.value();
  // A read that filled all the space suggests a bulk transfer: grow for bigger reads.
  if (n.value() == space && rbuf_.size() < kMaxReadBuffer)
    rbuf_.resize(std::min(kMaxReadBuffer, rbuf_.size() * 2));
  co_return success();
}

std::optional<Error> NoiseStream::read_state() const {
  if (reset_) {
    if (read_error_ && *read_error_ == errc::protocol_violation) return *read_error_;
    return make_error(errc::reset, describe_ + " read: reset");
  }
  return read_error_;
}

bool NoiseStream::frame_ready() const noexcept {
  if (ppos_ < pend_) return true;
  const std::size_t avail = rend_ - rpos_;
  return avail >= 2 && avail >= 2 + std::size_t{load_be16(rbuf_.data() + rpos_)};
}

awaitable<result<void>> NoiseStream::wait_readable() {
  for (;;) {
    if (auto e = read_state()) co_return *e;
    if (frame_ready()) co_return success();
    ST_CO_TRY(co_await fill());
  }
}

result<std::size_t> NoiseStream::read_buffered(MutableBytesView buf) {
  if (auto e = read_state()) return *e;
  if (buf.empty()) return std::size_t{0};
  return drain(buf);
}

awaitable<result<std::size_t>> NoiseStream::read_some(MutableBytesView buf) {
  if (buf.empty()) co_return std::size_t{0};
  for (;;) {
    if (auto e = read_state()) co_return *e;
    ST_CO_TRY(auto n, drain(buf));
    if (n > 0) co_return n;
    ST_CO_TRY(co_await fill());
  }
}

// ---- write side ----

awaitable<result<void>> NoiseStream::write(BytesView data) {
  if (reset_) co_return make_error(errc::reset, describe_ + " write: reset");
  if (write_error_) co_return *write_error_;
  if (write_closed_) co_return make_error(errc::closed, describe_ + " write after close_write");
  constexpr std::size_t kFrameOverhead = 2 + noise::kTagLen;
  std::size_t pos = 0;
  while (pos < data.size()) {
    std::size_t rest = data.size() - pos;
    std::size_t frames = (rest + noise::kMaxPlaintext - 1) / noise::kMaxPlaintext;
    std::size_t batch = std::min(kWriteBatch, rest + frames * kFrameOverhead);
    if (wbuf_.size() < batch) wbuf_.resize(batch);
    std::size_t w = 0;
    while (pos < data.size()) {
      std::size_t chunk = std::min(noise::kMaxPlaintext, data.size() - pos);
      if (w + chunk + kFrameOverhead > wbuf_.size()) break;
      store_be16(wbuf_.data() + w, chunk + noise::kTagLen);
      auto sealed = send_.seal(data.data() + pos, chunk, wbuf_.data() + w + 2);
      if (!sealed) {
        write_error_ = sealed.error().with_context(describe_ + " write");
        reset();
        co_return *write_error_;
      }
      w += chunk + kFrameOverhead;
      pos += chunk;
    }
    auto r = co_await raw_->write(BytesView(wbuf_).first(w));
    if (!r) {
      // Frames may be half-sent and their nonces are spent: the stream cannot continue.
      write_error_ = reset_ ? make_error(errc::reset, describe_ + " write: reset")
                            : r.error().with_context(describe_ + " write");
      co_return *write_error_;
    }
  }
  co_return success();
}

awaitable<result<void>> NoiseStream::close_write() {
  if (reset_) co_return make_error(errc::reset, describe_ + " close_write: reset");
  if (write_error_) co_return *write_error_;
  if (write_closed_) co_return success();
  write_closed_ = true;
  co_return co_await raw_->close_write();
}

}  // namespace starling::net
