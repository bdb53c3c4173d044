// yamux::Session output: frames are queued synchronously into one buffer and the writer loop
// sends everything queued in one write of the connection (double buffering: streams keep
// queuing while a write is in flight). Also pings and the keepalive loop.
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "net/yamux_session.hpp"

namespace starling::net::yamux {

void Session::enqueue(const FrameHeader& h, BytesView payload) {
  if (writer_stopped_) return;
  std::uint8_t* p = pending_.grow(kHeaderSize + payload.size());
  encode_header(h, p);
  if (!payload.empty()) std::memcpy(p + kHeaderSize, payload.data(), payload.size());
  ++stats_.frames_sent;
  if (!writer_wake_.is_set()) writer_wake_.set();
  if (pending_.size() >= cfg_.write_buffer && space_.is_set()) space_.reset();
}

void Session::send_data(std::uint32_t id, BytesView payload) {
  enqueue(FrameHeader{FrameType::data, 0, id, static_cast<std::uint32_t>(payload.size())}, payload);
  stats_.data_bytes_sent += payload.size();
}

void Session::send_frame(FrameType type, std::uint16_t flags, std::uint32_t id,
                         std::uint32_t length) {
  enqueue(FrameHeader{type, flags, id, length}, {});
}

awaitable<result<void>> Session::wait_send_space() {
  while (!dead_ && send_buffer_full()) {
    ST_CO_TRY(co_await space_.wait());
  }
  co_return success();
}

awaitable<void> Session::writer_loop() {
  for (;;) {
    if (pending_.empty()) {
      if (dead_) break;
      writer_wake_.reset();
      auto w = co_await writer_wake_.wait();
      if (!w) {
        writer_stopped_ = true;
        writer_done_.set();
        co_return;
      }
      continue;
    }
    std::swap(pending_, inflight_);
    space_.set();
    auto r = co_await conn_->write(inflight_.view());
    ++stats_.conn_writes;
    inflight_.clear();
    if (!r) {
      writer_stopped_ = true;
      if (!dead_) {
        log().debug("{}: write failed: {}", describe_, r.error().message());
        terminate(r.error().with_context(describe_ + ": write"), std::nullopt);
      }
      writer_done_.set();
      co_return;
    }
  }
  // Ended and flushed (GoAway included): half-close so the peer reads EOF after our last frame.
  writer_stopped_ = true;
  (void)co_await conn_->close_write();
  writer_done_.set();
}

awaitable<result<Duration>> Session::wait_pong(std::shared_ptr<PendingPing> p) {
  auto w = co_await p->done.wait();
  if (p->outcome) co_return *p->outcome;
  if (!w) co_return w.error();
  co_return make_error(errc::internal, "ping woken without outcome");
}

awaitable<result<Duration>> Session::ping(Duration timeout) {
  auto self = shared_from_this();
  if (dead_)
    co_return Error(errc::closed, describe_ + ": ping on an ended session" +
                                      (reason_ ? ": " + reason_->message() : std::string()));
  const std::uint32_t id = next_ping_id_++;
  auto p = std::make_shared<PendingPing>(ex_);
  p->sent = Clock::now();
  pings_[id] = p;
  ++stats_.pings_sent;
  send_frame(FrameType::ping, flag::syn, 0, id);
  auto r = co_await with_timeout(
      wait_pong(p), timeout,
      fmt::format("{}: ping not answered within {} ms", describe_,
                  std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()));
  pings_.erase(id);
  co_return r;
}

void Session::on_ping(const FrameHeader& h) {
  if (h.has(flag::syn)) {
    ++stats_.pings_answered;
    send_frame(FrameType::ping, flag::ack, 0, h.length);
    return;
  }
  auto it = pings_.find(h.length);
  if (it == pings_.end()) {
    log().debug("{}: unsolicited ping answer {} ignored", describe_, h.length);
    return;
  }
  auto p = it->second;
  pings_.erase(it);
  const Duration sample = Clock::now() - p->sent;
  srtt_ = srtt_ == Duration::zero() ? sample : (srtt_ * 7 + sample) / 8;
  p->outcome = sample;
  p->done.set();
}

awaitable<result<void>> Session::wait_idle(Duration limit) {
  // Until nothing has arrived for `limit`: every frame received moves the goal.
  for (;;) {
    const TimePoint due = last_rx_ + limit;
    const TimePoint now = Clock::now();
    if (now >= due) co_return success();
    ST_CO_TRY(co_await sleep_for(due - now));
    if (dead_) co_return make_error(errc::closed, describe_ + ": session ended");
  }
}

awaitable<void> Session::keepalive_loop() {
  // The first ping measures the RTT for window auto-tuning; later ones are probes of an idle
  // connection: the dialer's after keepalive_interval, the listener's after the longer
  // keepalive_listener_idle, both counted from the last frame received.
  const Duration idle_limit = is_client_ ? cfg_.keepalive_interval : cfg_.keepalive_listener_idle;
  const Duration timeout =
      cfg_.keepalive_timeout > Duration::zero() ? cfg_.keepalive_timeout : Duration(10s);
  for (bool first = true;; first = false) {
    if (!first) {
      if (idle_limit <= Duration::zero()) co_return;
      if (!co_await wait_idle(idle_limit)) co_return;
      ++stats_.keepalive_probes;
    }
    if (dead_) co_return;
    const TimePoint sent = Clock::now();
    auto r = co_await ping(timeout);
    if (dead_ || r || r.error() != errc::timeout) {
      if (!r && !dead_ && r.error() == errc::cancelled) co_return;
      continue;
    }
    if (idle_limit <= Duration::zero()) co_return;
    if (last_rx_ > sent) {
      // Our ping may sit behind a long send queue on a slow link; the peer is evidently alive.
      log().debug("{}: keepalive ping late, but the peer is sending", describe_);
      continue;
    }
    ++stats_.keepalive_failures;
    log().warn("{}: keepalive ping not answered within {} ms, closing", describe_,
               std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
    terminate(r.error(), std::nullopt);
    co_return;
  }
}

}  // namespace starling::net::yamux
