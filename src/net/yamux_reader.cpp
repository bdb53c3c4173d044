// yamux::Session input: the reader loop parses frames from the connection and dispatches
// them; data payloads are handed to streams as they arrive (no frame is buffered whole).
// Anything a peer may not send ends the session with GoAway(protocol error).
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "net/yamux_session.hpp"

namespace starling::net::yamux {

namespace {
Error violation(std::string what) {
  return Error(errc::protocol_violation, std::move(what));
}
}  // namespace

bool Session::never_opened(std::uint32_t id) const noexcept {
  return is_remote_id(id) ? id > last_remote_id_ : id >= next_local_id_;
}

void Session::protocol_error(const Error& e) {
  log().warn("{}: {}; sending GoAway(protocol error)", describe_, e.message());
  terminate(e.with_context(describe_), YamuxGoAway::protocol_error);
}

awaitable<void> Session::reader_loop() {
  // The buffer starts small and doubles after every read that filled it, up to
  // cfg_.read_buffer: an idle or request/response connection (most of a DHT node's hundreds)
  // holds 4 KiB, not the 256 KiB a bulk transfer reads with.
  rbuf_.reserve(std::min<std::size_t>(kFirstReadBuffer, cfg_.read_buffer));
  std::uint8_t* base = rbuf_.data();
  std::size_t cap = rbuf_.capacity();
  // Control frames we queue in answer to the peer (pongs, RSTs) bypass the write buffer
  // limit; a peer that sends them in bulk while never reading would grow our queue forever.
  const std::size_t control_limit = cfg_.write_buffer + cfg_.max_frame_payload + (1u << 20);
  std::size_t start = 0, end = 0;
  const bool direct = conn_->buffered_reads();
  while (!dead_) {
    while (!dead_) {
      const std::size_t avail = end - start;
      if (payload_left_ > 0) {
        if (avail == 0) {
          if (!direct) break;
          auto d = direct_payload();
          if (!d) {
            terminate(d.error().with_context(describe_ + ": read"), std::nullopt);
            break;
          }
          if (d.value() == 0) break;
          continue;
        }
        const std::size_t n = std::min<std::size_t>(avail, payload_left_);
        on_payload(base + start, n);
        start += n;
        payload_left_ -= static_cast<std::uint32_t>(n);
        if (payload_left_ == 0) on_frame_end();
        continue;
      }
      if (avail < kHeaderSize) break;
      auto h = decode_header(BytesView(base + start, kHeaderSize));
      start += kHeaderSize;
      if (!h) {
        protocol_error(h.error());
        break;
      }
      if (auto r = on_header(h.value()); !r) {
        protocol_error(r.error());
        break;
      }
      if (pending_.size() > control_limit) {
        protocol_error(Error(errc::too_large, "peer floods control frames without reading"));
        break;
      }
    }
    if (dead_) break;
    if (start > 0) {  // keep a partial header at the front
      std::memmove(base, base + start, end - start);
      end -= start;
      start = 0;
    }
    if (direct && start == end && payload_left_ > 0) {
      // Payload pending and nothing buffered here: wait until the connection has bytes, then
      // let direct_payload() put them into the reader's buffer if one is waiting by then.
      Stream* s = find(payload_stream_);
      if (s != nullptr && !s->direct_target().empty()) {
        auto w = co_await conn_->wait_readable();
        if (w) {
          last_rx_ = Clock::now();
          if (auto* t = find(payload_stream_); t != nullptr && !t->direct_target().empty())
            continue;
        }
      }
    }
    auto n = co_await conn_->read_some(MutableBytesView(base + end, cap - end));
    if (!n) {
      if (!dead_) {
        if (n.error() == errc::closed)
          terminate(Error(errc::closed, describe_ + ": connection closed by peer"), std::nullopt);
        else
          terminate(n.error().with_context(describe_ + ": read"), std::nullopt);
      }
      reader_done_.set();
      co_return;
    }
    end += n.value();
    last_rx_ = Clock::now();
    if (end == cap && cap < cfg_.read_buffer) {  // start == 0 here
      OutBuffer bigger;
      bigger.reserve(std::min(cfg_.read_buffer, 2 * cap));
      std::memcpy(bigger.data(), base, end);
      rbuf_ = std::move(bigger);
      base = rbuf_.data();
      cap = rbuf_.capacity();
    }
  }
  // Ended: read (and ignore) whatever the peer still sends until it closes its side, so our
  // last frames are not destroyed by a TCP reset. Bounded by the shutdown linger.
  for (;;) {
    auto n = co_await conn_->read_some(MutableBytesView(base, cap));
    if (!n) break;
  }
  reader_done_.set();
}

result<void> Session::on_header(const FrameHeader& h) {
  ++stats_.frames_received;
  switch (h.type) {
    case FrameType::ping:
      on_ping(h);
      return success();
    case FrameType::go_away:
      return on_go_away(h);
    default:
      return on_stream_header(h);
  }
}

result<void> Session::on_stream_header(const FrameHeader& h) {
  const std::uint32_t id = h.stream_id;
  Stream* s = find(id);
  if (h.has(flag::syn)) {
    if (s != nullptr || !is_remote_id(id) || id <= last_remote_id_)
      return violation(fmt::format("{} opens stream {} ({})", to_string(h), id,
                                   s != nullptr        ? "already open"
                                   : !is_remote_id(id) ? "our parity"
                                                       : "id not above the last one"));
    last_remote_id_ = id;
    s = admit_inbound(id);
  } else if (s == nullptr && never_opened(id)) {
    return violation(fmt::format("{} for stream {} that was never opened", to_string(h), id));
  }
  if (s == nullptr) {
    // A stream that is gone (finished, reset or rejected): frames in flight are normal.
    if (h.type == FrameType::data && h.length > 0) {
      if (h.length > cfg_.max_window)
        return Error(errc::too_large,
                     fmt::format("{} is larger than any window we grant", to_string(h)));
      payload_left_ = h.length;
      payload_stream_ = id;
      payload_flags_ = 0;
    }
    return success();
  }
  if (h.has(flag::ack)) s->on_ack();
  if (h.type == FrameType::window_update) {
    ST_TRY(s->on_window_update(h.length));
    apply_end_flags(*s, h.flags);
    return success();
  }
  if (h.length > 0 && s->remote_fin())
    return violation(fmt::format("{} after the peer's FIN", to_string(h)));
  if (!s->recv().on_data(h.length))
    return violation(fmt::format("{} exceeds the receive window ({} bytes left)", to_string(h),
                                 s->recv().credit()));
  if (h.length == 0) {
    apply_end_flags(*s, h.flags);
    return success();
  }
  payload_left_ = h.length;
  payload_stream_ = id;
  payload_flags_ = h.flags;
  return success();
}

void Session::on_payload(const std::uint8_t* p, std::size_t n) {
  stats_.data_bytes_received += n;
  if (Stream* s = find(payload_stream_)) s->on_data(p, n);
}

result<std::size_t> Session::direct_payload() {
  Stream* s = find(payload_stream_);
  if (s == nullptr) return std::size_t{0};
  MutableBytesView dst = s->direct_target();
  if (dst.empty()) return std::size_t{0};
  dst = dst.first(std::min<std::size_t>(dst.size(), payload_left_));
  ST_TRY(auto n, conn_->read_buffered(dst));
  if (n == 0) return std::size_t{0};
  stats_.data_bytes_received += n;
  stats_.data_bytes_direct += n;
  s->on_direct(n);
  payload_left_ -= static_cast<std::uint32_t>(n);
  if (payload_left_ == 0) on_frame_end();
  return n;
}

void Session::on_frame_end() {
  if (payload_flags_ == 0) return;
  if (Stream* s = find(payload_stream_)) apply_end_flags(*s, payload_flags_);
}

void Session::apply_end_flags(Stream& s, std::uint16_t flags) {
  if (flags & flag::rst) {
    s.on_remote_rst();
  } else if ((flags & flag::fin) && !s.remote_fin()) {
    s.on_remote_fin();
  }
}

Stream* Session::admit_inbound(std::uint32_t id) {
  const char* why = nullptr;
  if (local_goaway_ || dead_) {
    why = "session is closing";
  } else if (streams_.size() >= cfg_.max_streams) {
    why = "stream limit reached";
  } else if (accept_q_.size() >= cfg_.accept_backlog) {
    why = "accept backlog full";
  }
  if (why != nullptr) {
    ++stats_.streams_rejected;
    if (!rejection_logged_) {
      rejection_logged_ = true;
      log().warn("{}: rejecting inbound stream {} ({}); further rejections logged at debug",
                 describe_, id, why);
    } else {
      log().debug("{}: rejecting inbound stream {} ({})", describe_, id, why);
    }
    send_frame(FrameType::window_update, flag::rst, id, 0);
    return nullptr;
  }
  auto s = std::make_shared<Stream>(shared_from_this(), id, false);
  streams_.emplace(id, s.get());
  s->registered_ = true;
  s->needs_ack_ = true;
  accept_q_.push_back(s);
  accept_ev_.set();
  ++stats_.streams_accepted;
  return s.get();
}

result<void> Session::on_go_away(const FrameHeader& h) {
  if (h.length == static_cast<std::uint32_t>(YamuxGoAway::normal)) {
    log().debug("{}: peer sent GoAway(normal)", describe_);
    remote_goaway_ = true;
    maybe_close_after_goaway();
    return success();
  }
  const char* name =
      h.length == static_cast<std::uint32_t>(YamuxGoAway::protocol_error)   ? "protocol error"
      : h.length == static_cast<std::uint32_t>(YamuxGoAway::internal_error) ? "internal error"
                                                                            : "unknown code";
  Error e(errc::reset, fmt::format("{}: peer sent GoAway({}, {})", describe_, h.length, name));
  log().warn("{}", e.message());
  terminate(std::move(e), std::nullopt);
  return success();
}

}  // namespace starling::net::yamux
