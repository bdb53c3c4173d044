// yamux::Stream: the application's side of one yamux stream (read/write with flow control,
// half-close, reset).
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "net/yamux_session.hpp"

namespace starling::net::yamux {

Stream::Stream(std::shared_ptr<Session> session, std::uint32_t id, bool outbound)
    : session_(std::move(session)),
      id_(id),
      outbound_(outbound),
      describe_(fmt::format("yamux stream {} on {}", id, session_->conn_describe())),
      recv_(session_->config().initial_window, Clock::now()),
      read_ev_(session_->executor()),
      write_ev_(session_->executor()) {}

Stream::~Stream() {
  if (registered_) {
    // Dropped before our side finished writing: tell the peer with RST. A stream whose write
    // side was closed (FIN sent) is released quietly, so the peer still reads what we sent;
    // anything it sends afterwards is discarded by the session.
    if (!session_->dead() && !local_fin_ && !reset_)
      session_->send_frame(FrameType::window_update, flag::rst, id_, 0);
    session_->unregister(*this);
  }
}

asio::any_io_executor Stream::get_executor() {
  return session_->executor();
}

awaitable<result<std::size_t>> Stream::read_some(MutableBytesView buf) {
  if (buf.empty()) co_return std::size_t{0};
  for (;;) {
    if (read_err_) co_return *read_err_;
    if (!buf_.empty()) {
      const std::size_t n = buf_.pop(buf.data(), buf.size());
      recv_.on_consumed(n);
      maybe_send_window_update();
      co_return n;
    }
    if (remote_fin_) co_return make_error(errc::closed, describe_ + ": closed by peer");
    // While we wait, the reader loop copies payload straight into `buf` (see on_data).
    wait_buf_ = buf;
    wait_got_ = 0;
    read_ev_.reset();
    auto w = co_await read_ev_.wait();
    const std::size_t got = wait_got_;
    wait_buf_ = {};
    wait_got_ = 0;
    if (got > 0) {  // delivered data wins over a cancellation that raced with it
      recv_.on_consumed(got);
      maybe_send_window_update();
      co_return got;
    }
    if (!w) co_return make_error(errc::cancelled, describe_ + ": read cancelled");
  }
}

void Stream::maybe_send_window_update() {
  if (!registered_ || remote_fin_ || !recv_.update_due()) return;
  const auto growths = recv_.growths();
  const std::uint32_t delta = recv_.take_update(Clock::now(), session_->rtt(),
                                                session_->auto_tune(), session_->budget(), false);
  session_->note_window(recv_, recv_.growths() - growths);
  if (delta > 0) session_->send_frame(FrameType::window_update, 0, id_, delta);
}

awaitable<result<void>> Stream::write(BytesView data) {
  std::size_t off = 0;
  const std::size_t max_frame = std::max<std::size_t>(session_->config().max_frame_payload, 1);
  while (off < data.size()) {
    if (write_err_) co_return *write_err_;
    if (local_fin_) co_return make_error(errc::closed, describe_ + ": write after close_write");
    if (send_.credit() == 0) {
      write_ev_.reset();
      auto w = co_await write_ev_.wait();
      if (!w) co_return make_error(errc::cancelled, describe_ + ": write cancelled");
      continue;
    }
    if (session_->send_buffer_full()) {
      auto w = co_await session_->wait_send_space();
      if (!w) co_return make_error(errc::cancelled, describe_ + ": write cancelled");
      continue;
    }
    const std::size_t n =
        std::min({data.size() - off, static_cast<std::size_t>(send_.credit()), max_frame});
    session_->send_data(id_, data.subspan(off, n));
    send_.consume(n);
    off += n;
  }
  co_return success();
}

awaitable<result<void>> Stream::close_write() {
  if (write_err_) co_return *write_err_;
  if (local_fin_) co_return success();
  local_fin_ = true;
  session_->send_frame(FrameType::window_update, flag::fin, id_, 0);
  if (remote_fin_ && registered_) session_->unregister(*this);
  co_return success();
}

void Stream::reset() {
  if (reset_) return;
  if (registered_ && !session_->dead())
    session_->send_frame(FrameType::window_update, flag::rst, id_, 0);
  fail(Error(errc::reset, describe_ + ": reset locally"));
  if (registered_) session_->unregister(*this);
}

void Stream::fail(const Error& e) {
  reset_ = true;
  if (!read_err_) read_err_ = e;
  if (!write_err_) write_err_ = e;
  buf_.release();
  read_ev_.set();
  write_ev_.set();
}

void Stream::on_data(const std::uint8_t* p, std::size_t n) {
  // A reader is waiting and nothing is queued before this data: copy into its buffer, the
  // rest (if any) into the queue. Its buffer stays valid until it resumes, which happens
  // after this (synchronous) call.
  if (wait_got_ < wait_buf_.size() && buf_.empty()) {
    const std::size_t k = std::min(n, wait_buf_.size() - wait_got_);
    std::memcpy(wait_buf_.data() + wait_got_, p, k);
    wait_got_ += k;
    p += k;
    n -= k;
  }
  if (n > 0) buf_.append(p, n);
  // Set means no reader is waiting (a reader resets the event before it waits).
  if (!read_ev_.is_set()) read_ev_.set();
}

MutableBytesView Stream::direct_target() const noexcept {
  if (reset_ || !buf_.empty() || wait_got_ >= wait_buf_.size()) return {};
  return wait_buf_.subspan(wait_got_);
}

void Stream::on_direct(std::size_t n) {
  wait_got_ += n;
  if (!read_ev_.is_set()) read_ev_.set();
}

result<void> Stream::on_window_update(std::uint32_t delta) {
  if (delta == 0) return success();
  auto r = send_.on_update(delta);
  if (!r) return r.error().with_context(fmt::format("stream {}", id_));
  write_ev_.set();
  return success();
}

void Stream::on_ack() noexcept {
  if (!awaiting_ack_) return;
  awaiting_ack_ = false;
  session_->unregister_ack();
}

void Stream::on_remote_fin() {
  remote_fin_ = true;
  read_ev_.set();
  if (local_fin_ && registered_) session_->unregister(*this);
}

void Stream::on_remote_rst() {
  fail(Error(errc::reset, describe_ + ": reset by peer"));
  if (registered_) session_->unregister(*this);
}

void Stream::on_session_end(const Error& why) {
  Error e(errc::reset, describe_ + ": session ended: " + why.message());
  if (!write_err_) write_err_ = e;
  if (!remote_fin_ && !read_err_) read_err_ = e;
  read_ev_.set();
  write_ev_.set();
}

void Stream::send_open_frame() {
  const std::uint16_t f = outbound_ ? flag::syn : flag::ack;
  needs_ack_ = false;
  const std::uint32_t delta = recv_.take_update(Clock::now(), session_->rtt(),
                                                session_->auto_tune(), session_->budget(), true);
  session_->note_window(recv_, 0);
  session_->send_frame(FrameType::window_update, f, id_, delta);
}

YamuxStreamStats Stream::stats() const {
  YamuxStreamStats s;
  s.id = id_;
  s.recv_window = recv_.window();
  s.recv_credit = recv_.credit();
  s.buffered = buf_.size();
  s.send_credit = send_.credit();
  s.local_fin = local_fin_;
  s.remote_fin = remote_fin_;
  s.reset = reset_;
  return s;
}

}  // namespace starling::net::yamux

namespace starling::net {

std::optional<YamuxStreamStats> yamux_stream_stats(const ByteStream& s) {
  if (auto* y = dynamic_cast<const yamux::Stream*>(&s)) return y->stats();
  return std::nullopt;
}

}  // namespace starling::net
