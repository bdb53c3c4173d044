// yamux::Session lifecycle: construction, opening and accepting streams, close / terminate
// and the bounded shutdown of the connection; plus the public YamuxSession handle.
#include "net/yamux_session.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace starling::net::yamux {

spdlog::logger& log() {
  static const auto l = logger("net");
  return *l;
}

namespace {
YamuxConfig sanitize(YamuxConfig c) {
  c.initial_window = std::max(c.initial_window, kInitialWindow);
  c.max_window = std::max(c.max_window, c.initial_window);
  c.max_frame_payload = std::clamp<std::size_t>(c.max_frame_payload, 1, 16 * 1024 * 1024);
  c.write_buffer = std::max<std::size_t>(c.write_buffer, 1);
  c.read_buffer = std::max<std::size_t>(c.read_buffer, 4096);
  c.max_unacked_outbound = std::max<std::size_t>(c.max_unacked_outbound, 1);
  return c;
}

long long ms(Duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

Error closed_error(const std::string& what, const std::optional<Error>& reason) {
  return Error(errc::closed, reason ? what + ": " + reason->message() : what);
}
}  // namespace

Session::Session(ByteStreamPtr conn, bool is_client, YamuxConfig cfg)
    : conn_(std::move(conn)),
      ex_(conn_->get_executor()),
      is_client_(is_client),
      cfg_(sanitize(cfg)),
      tune_{cfg_.auto_tune_window, cfg_.max_window},
      conn_describe_(conn_->describe()),
      describe_("yamux on " + conn_describe_),
      scope_(ex_),
      budget_(cfg_.session_window_budget),
      accept_ev_(ex_),
      streams_changed_(ex_),
      ack_ev_(ex_),
      next_local_id_(is_client ? 1 : 2),
      writer_wake_(ex_),
      space_(ex_),
      writer_done_(ex_),
      reader_done_(ex_) {
  space_.set();
}

Session::~Session() = default;

void Session::start() {
  if (started_ || dead_) return;
  started_ = true;
  last_rx_ = Clock::now();  // idle time counts from the start
  auto self = shared_from_this();
  scope_.spawn(run_reader(self));
  scope_.spawn(run_writer(self));
  scope_.spawn(run_keepalive(self));
}

awaitable<void> Session::run_reader(std::shared_ptr<Session> self) {
  co_await self->reader_loop();
}
awaitable<void> Session::run_writer(std::shared_ptr<Session> self) {
  co_await self->writer_loop();
}
awaitable<void> Session::run_keepalive(std::shared_ptr<Session> self) {
  co_await self->keepalive_loop();
}
awaitable<void> Session::run_close(std::shared_ptr<Session> self, Error why) {
  co_await self->close_with(std::move(why));
}

awaitable<result<void>> Session::wait_ack_backlog() {
  while (!dead_ && unacked_outbound_ >= cfg_.max_unacked_outbound) {
    ack_ev_.reset();
    ST_CO_TRY(co_await ack_ev_.wait());
  }
  co_return success();
}

awaitable<result<ByteStreamPtr>> Session::open_stream() {
  auto self = shared_from_this();
  if (dead_ || local_goaway_)
    co_return closed_error(describe_ + ": open_stream on a closed session", reason_);
  if (unacked_outbound_ >= cfg_.max_unacked_outbound) {
    auto w =
        co_await with_timeout(wait_ack_backlog(), cfg_.open_timeout,
                              fmt::format("{}: open_stream: {} streams still unacknowledged "
                                          "after {} ms",
                                          describe_, unacked_outbound_, ms(cfg_.open_timeout)));
    if (!w) co_return w.error();
  }
  if (dead_ || local_goaway_)
    co_return closed_error(describe_ + ": open_stream on a closed session", reason_);
  if (remote_goaway_)
    co_return make_error(errc::closed, describe_ + ": peer sent GoAway, no new streams");
  if (streams_.size() >= cfg_.max_streams)
    co_return make_error(errc::unavailable,
                         fmt::format("{}: stream limit {} reached", describe_, cfg_.max_streams));
  if (next_local_id_ > 0xffffffffull)
    co_return make_error(errc::unavailable, describe_ + ": stream ids exhausted");
  const auto id = static_cast<std::uint32_t>(next_local_id_);
  next_local_id_ += 2;
  auto s = std::make_shared<Stream>(self, id, true);
  streams_.emplace(id, s.get());
  s->registered_ = true;
  s->awaiting_ack_ = true;
  ++unacked_outbound_;
  ++stats_.streams_opened;
  s->send_open_frame();
  co_return ByteStreamPtr(std::move(s));
}

awaitable<result<ByteStreamPtr>> Session::accept_stream() {
  auto self = shared_from_this();
  for (;;) {
    while (!accept_q_.empty()) {
      auto s = std::move(accept_q_.front());
      accept_q_.pop_front();
      if (s->is_reset()) continue;  // the peer gave up on it already
      if (s->needs_ack_) s->send_open_frame();
      co_return ByteStreamPtr(std::move(s));
    }
    if (dead_ || local_goaway_) co_return closed_error(describe_ + ": accept_stream", reason_);
    accept_ev_.reset();
    auto w = co_await accept_ev_.wait();
    if (!w) co_return make_error(errc::cancelled, describe_ + ": accept_stream cancelled");
  }
}

Stream* Session::find(std::uint32_t id) const {
  auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second;
}

void Session::unregister(Stream& s) {
  if (!s.registered_) return;
  s.registered_ = false;
  streams_.erase(s.id());
  if (s.awaiting_ack_) {
    s.awaiting_ack_ = false;
    unregister_ack();
  }
  budget_.release(s.recv().grown());
  streams_changed_.set();
  maybe_close_after_goaway();
}

void Session::unregister_ack() noexcept {
  if (unacked_outbound_ > 0) --unacked_outbound_;
  ack_ev_.set();
}

void Session::note_window(const RecvWindow& w, std::uint64_t growths) noexcept {
  stats_.largest_recv_window = std::max(stats_.largest_recv_window, w.window());
  stats_.window_growths += growths;
  stats_.window_budget_peak = std::max(stats_.window_budget_peak, budget_.used());
}

void Session::maybe_close_after_goaway() {
  // The peer will open nothing more and we may not either: once the last stream is done
  // the session has no use, so close it.
  if (!remote_goaway_ || closing_ || dead_ || !streams_.empty()) return;
  asio::co_spawn(ex_, run_close(shared_from_this(), Error(errc::closed, "peer sent GoAway")),
                 asio::detached);
}

awaitable<void> Session::close() {
  co_await close_with(Error(errc::closed, describe_ + ": closed locally"));
}

awaitable<void> Session::close_with(Error why) {
  auto self = shared_from_this();
  const TimePoint deadline = Clock::now() + cfg_.close_timeout;
  if (!dead_ && !closing_) {
    closing_ = true;
    local_goaway_ = true;
    if (!goaway_sent_) {
      goaway_sent_ = true;
      send_frame(FrameType::go_away, 0, 0, static_cast<std::uint32_t>(YamuxGoAway::normal));
    }
    // Nobody will accept the queued inbound streams any more.
    auto queued = std::move(accept_q_);
    accept_q_.clear();
    for (auto& s : queued) s->reset();
    accept_ev_.set();
    // Let open streams finish, keeping a little time to flush and close the connection.
    const Duration linger = std::min<Duration>(cfg_.close_timeout / 4, 1s);
    while (!dead_ && !streams_.empty()) {
      const Duration left = deadline - linger - Clock::now();
      if (left <= Duration::zero()) break;
      streams_changed_.reset();
      auto w = co_await with_timeout(streams_changed_.wait(), left, "");
      if (!w && w.error() == errc::cancelled) break;
    }
    if (!dead_) {
      if (!streams_.empty()) {
        log().debug("{}: resetting {} stream(s) still open at close", describe_, streams_.size());
        for (auto& [id, s] : streams_) send_frame(FrameType::window_update, flag::rst, id, 0);
      }
      terminate(std::move(why), std::nullopt,
                std::max<Duration>(deadline - Clock::now() - 20ms, Duration::zero()));
    }
  }
  // Done once our last frames are flushed and the connection half-closed; the wait for the
  // peer's EOF and the release of the connection continue in the background (run_finish),
  // bounded by the same deadline.
  const Duration left = deadline - Clock::now();
  if (!writer_done_.is_set() && left > Duration::zero())
    (void)co_await with_timeout(writer_done_.wait(), left, "");
}

void Session::abort(Error why) {
  terminate(std::move(why), YamuxGoAway::normal);
}

void Session::terminate(Error why, std::optional<YamuxGoAway> goaway, Duration linger) {
  if (dead_) return;
  auto self = shared_from_this();
  dead_ = true;
  local_goaway_ = true;
  reason_ = why;
  if (goaway && !goaway_sent_) {
    goaway_sent_ = true;
    send_frame(FrameType::go_away, 0, 0, static_cast<std::uint32_t>(*goaway));
  }
  auto streams = std::move(streams_);
  streams_.clear();
  for (auto& [id, s] : streams) {
    s->registered_ = false;
    s->awaiting_ack_ = false;
    budget_.release(s->recv().grown());
    s->on_session_end(why);
  }
  unacked_outbound_ = 0;
  accept_q_.clear();
  for (auto& [id, p] : pings_) {
    p->outcome = closed_error(describe_ + ": ping", reason_);
    p->done.set();
  }
  pings_.clear();
  accept_ev_.set();
  ack_ev_.set();
  space_.set();
  streams_changed_.set();
  writer_wake_.set();
  if (!started_) {
    writer_stopped_ = true;
    writer_done_.set();
    reader_done_.set();
  }
  if (on_close_) asio::post(ex_, [cb = on_close_, why] { cb(why); });
  asio::co_spawn(ex_, run_finish(self, linger), asio::detached);
}

awaitable<result<void>> Session::wait_io_done(std::shared_ptr<Session> self) {
  ST_CO_TRY(co_await self->writer_done_.wait());
  ST_CO_TRY(co_await self->reader_done_.wait());
  co_return success();
}

awaitable<void> Session::run_finish(std::shared_ptr<Session> self, Duration linger) {
  // Graceful: the writer flushed and half-closed, the reader saw the peer's EOF. Otherwise
  // (peer unresponsive, error) abort the connection when the linger time is up.
  auto done = co_await with_timeout(wait_io_done(self), linger, "");
  if (!done) self->conn_->reset();
  auto stopped = co_await self->scope_.close(500ms);
  if (stopped) self->conn_.reset();
}

void Session::set_on_close(std::function<void(const Error&)> cb) {
  on_close_ = std::move(cb);
  if (dead_ && on_close_ && reason_) asio::post(ex_, [cb = on_close_, why = *reason_] { cb(why); });
}

YamuxStats Session::stats() const {
  YamuxStats s = stats_;
  s.streams = streams_.size();
  s.window_budget_used = budget_.used();
  s.rtt = srtt_;
  return s;
}

}  // namespace starling::net::yamux

namespace starling::net {

std::shared_ptr<YamuxSession> YamuxSession::create(ByteStreamPtr conn, bool is_client,
                                                   YamuxConfig cfg) {
  auto s = std::make_shared<yamux::Session>(std::move(conn), is_client, cfg);
  return std::shared_ptr<YamuxSession>(new YamuxSession(std::move(s)));
}

YamuxSession::YamuxSession(std::shared_ptr<yamux::Session> s) : s_(std::move(s)) {}

YamuxSession::~YamuxSession() {
  if (s_ && !s_->dead()) s_->abort(Error(errc::closed, s_->describe() + ": session dropped"));
}

void YamuxSession::start() {
  s_->start();
}

awaitable<result<ByteStreamPtr>> YamuxSession::open_stream() {
  auto s = s_;
  co_return co_await s->open_stream();
}

awaitable<result<ByteStreamPtr>> YamuxSession::accept_stream() {
  auto s = s_;
  co_return co_await s->accept_stream();
}

awaitable<result<Duration>> YamuxSession::ping(Duration timeout) {
  auto s = s_;
  co_return co_await s->ping(timeout);
}

awaitable<void> YamuxSession::close() {
  auto s = s_;
  co_await s->close();
}

bool YamuxSession::closed() const {
  return s_->closed();
}
std::size_t YamuxSession::stream_count() const {
  return s_->stream_count();
}
void YamuxSession::set_on_close(std::function<void(const Error&)> cb) {
  s_->set_on_close(std::move(cb));
}
YamuxStats YamuxSession::stats() const {
  return s_->stats();
}
std::string YamuxSession::describe() const {
  return s_->describe();
}

}  // namespace starling::net
