// Server side of RPC calls: ServerCall (framing for one inbound call), serve_stream (the call's
// life: header, request, handler under the deadline, final status) and RpcServer.
#include <algorithm>
#include <optional>
#include <utility>

#include <asio/experimental/awaitable_operators.hpp>

#include "starling/core/log.hpp"
#include "starling/net/rpc.hpp"

namespace starling::net {

namespace detail {

namespace {

std::string ms_string(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

bool is_client_fault(const Error& e) {
  return e == errc::invalid_argument || e == errc::protocol_violation || e == errc::too_large;
}

}  // namespace

// ---------------------------------------------------------------- ServerCall

ServerCall::ServerCall(ByteStreamPtr stream, std::size_t max_request, std::size_t max_response)
    : stream_(std::move(stream)),
      reader_(*stream_),
      max_request_(max_request),
      max_response_(max_response) {}

ServerCall::~ServerCall() {
  if (!finished_) stream_->reset();
}

void ServerCall::reset() {
  broken_ = true;
  finished_ = true;
  stream_->reset();
}

awaitable<result<RequestHeader>> ServerCall::read_header() {
  auto len = co_await read_frame_length(reader_);
  if (!len) {
    broken_ = true;
    co_return len.error();
  }
  if (!len.value()) co_return make_error(errc::closed, "stream closed before the request header");
  if (*len.value() > kMaxHeaderSize) {
    broken_ = true;
    co_return make_error(errc::too_large, "request header of " + std::to_string(*len.value()) +
                                              " bytes exceeds limit " +
                                              std::to_string(kMaxHeaderSize));
  }
  auto raw = co_await read_frame_body(reader_, static_cast<std::size_t>(*len.value()));
  if (!raw) {
    broken_ = true;
    co_return raw.error();
  }
  co_return decode_header(raw.value());
}

awaitable<result<std::optional<Bytes>>> ServerCall::read_frame() {
  if (client_closed_) co_return std::optional<Bytes>{};
  auto len = co_await read_frame_length(reader_);
  if (!len) {
    if (len.error() != errc::cancelled) broken_ = true;
    co_return len.error();
  }
  if (!len.value()) {
    client_closed_ = true;
    co_return std::optional<Bytes>{};
  }
  std::uint64_t n = *len.value();
  if (n > max_request_) {
    broken_ = true;  // the frame is not read: the stream is out of step from here on
    co_return make_error(errc::too_large, "request message of " + std::to_string(n) +
                                              " bytes exceeds limit " +
                                              std::to_string(max_request_));
  }
  auto raw = co_await read_frame_body(reader_, static_cast<std::size_t>(n));
  if (!raw) {
    broken_ = true;
    co_return raw.error();
  }
  co_return std::optional<Bytes>(std::move(raw).value());
}

awaitable<result<bool>> ServerCall::read_message(google::protobuf::MessageLite& out) {
  ST_CO_TRY(auto frame, co_await read_frame());
  if (!frame) co_return false;
  ST_CO_TRY(parse_message(*frame, out, "request"));
  co_return true;
}

awaitable<result<void>> ServerCall::write_message(const google::protobuf::MessageLite& msg) {
  if (broken_) co_return make_error(errc::reset, "call stream is broken");
  ST_CO_TRY(auto frame, encode_payload_frame(msg, max_response_, "response"));
  auto w = co_await stream_->write(frame);
  if (!w) {
    // The frame may be half written (e.g. the write was cancelled): nothing more can be
    // sent on this stream, not even a status.
    broken_ = true;
    write_broken_ = true;
  }
  co_return w;
}

awaitable<result<void>> ServerCall::watch() {
  if (reader_.buffered() > 0)
    co_return make_error(errc::protocol_violation, "client sent data after its request");
  if (!client_closed_) {
    std::uint8_t byte[1];
    auto n = co_await stream_->read_some(byte);
    if (n) co_return make_error(errc::protocol_violation, "client sent data after its request");
    if (n.error() == errc::cancelled) co_return n.error();
    if (n.error() != errc::closed) {
      broken_ = true;  // reset or I/O error: the client is gone
      co_return n.error();
    }
    client_closed_ = true;
  }
  // The client half-closed early: nothing more to watch; wait until cancelled.
  Timer forever(stream_->get_executor(), TimePoint::max());
  (void)co_await forever.async_wait(use_nothrow);
  co_return make_error(errc::cancelled);
}

awaitable<void> ServerCall::finish(std::uint32_t code, std::string_view message, Duration linger) {
  if (finished_) co_return;
  if (write_broken_) {
    reset();
    co_return;
  }
  auto deadline = Clock::now() + linger;
  auto send = [](ByteStream& s, Bytes frame) -> awaitable<result<void>> {
    ST_CO_TRY(co_await s.write(frame));
    co_return co_await s.close_write();
  };
  auto sent = co_await run_until(send(*stream_, encode_status_frame(code, message)), deadline,
                                 "sending the final status");
  if (!sent) {
    reset();
    co_return;
  }
  // Read (and drop) what the client still sends until its half-close, within a byte budget:
  // a clean end on both sides, so the transport can forget the stream.
  std::size_t budget = 2 * max_request_ + kMinFrameLimit;
  auto drain = [](ByteStream& s, BufferedReader& r, bool closed,
                  std::size_t budget) -> awaitable<result<void>> {
    std::size_t seen = r.take_buffered().size();
    if (closed) co_return success();
    Bytes scratch(16 * 1024);
    while (seen <= budget) {
      auto n = co_await s.read_some(scratch);
      if (!n) {
        if (n.error() == errc::closed) co_return success();
        co_return n.error();
      }
      seen += n.value();
    }
    co_return make_error(errc::too_large, "client kept sending after the final status");
  };
  auto drained =
      co_await run_until(drain(*stream_, reader_, client_closed_, budget), deadline, "draining");
  if (!drained) {
    reset();
    co_return;
  }
  finished_ = true;
}

// ---------------------------------------------------------------- serve_stream

namespace {

awaitable<result<void>> guarded_invoke(std::shared_ptr<const MethodEntry> m, const RpcContext& ctx,
                                       ServerCall& call) {
  try {
    co_return co_await m->invoke(ctx, call);
  } catch (const std::system_error& e) {
    if (e.code() == asio::error::operation_aborted)
      co_return make_error(errc::cancelled, "handler cancelled");
    co_return make_error(errc::internal, std::string("handler threw: ") + e.what());
  } catch (const std::exception& e) {
    co_return make_error(errc::internal, std::string("handler threw: ") + e.what());
  } catch (...) {
    co_return make_error(errc::internal, "handler threw a non-standard exception");
  }
}

// Runs the handler until it finishes, the deadline passes, or (unary / server-streaming) the
// watcher sees the client reset the stream or break the protocol; the others are cancelled.
awaitable<result<void>> run_handler(std::shared_ptr<const MethodEntry> m, const RpcContext& ctx,
                                    ServerCall& call) {
  using namespace asio::experimental::awaitable_operators;
  auto ex = co_await asio::this_coro::executor;
  Timer timer(ex, ctx.deadline());
  if (m->kind == MethodKind::bidi) {
    auto r = co_await (guarded_invoke(m, ctx, call) || timer.async_wait(use_nothrow));
    if (r.index() == 0) co_return std::move(std::get<0>(r));
    co_return make_error(errc::timeout, "handler ran past the call's deadline");
  }
  auto r = co_await (guarded_invoke(m, ctx, call) || timer.async_wait(use_nothrow) || call.watch());
  switch (r.index()) {
    case 0:
      co_return std::move(std::get<0>(r));
    case 1:
      co_return make_error(errc::timeout, "handler ran past the call's deadline");
    default: {
      auto& w = std::get<2>(r);
      if (w) co_return make_error(errc::internal, "watcher ended without a cause");
      co_return w.error();
    }
  }
}

// Counts a call being served, in total and for its peer (entries of idle peers are erased,
// so the map holds only peers with calls in progress).
struct ActiveGuard {
  ActiveGuard(std::shared_ptr<ServerShared> s, const PeerId& peer)
      : shared(std::move(s)), slot(shared->calls_by_peer.try_emplace(peer, 0).first) {
    ++shared->active_calls;
    ++slot->second;
  }
  ~ActiveGuard() { release(); }
  // The call no longer counts (idempotent): done before its final status goes out, so a
  // client that starts its next call on reading the status finds its slot free.
  void release() {
    if (released) return;
    released = true;
    --shared->active_calls;
    if (--slot->second == 0) shared->calls_by_peer.erase(slot);
  }
  ActiveGuard(const ActiveGuard&) = delete;
  ActiveGuard& operator=(const ActiveGuard&) = delete;
  std::shared_ptr<ServerShared> shared;
  std::map<PeerId, std::size_t>::iterator slot;
  bool released = false;
};

// Why a new call must be refused before it is served (nullopt: serve it).
std::optional<std::pair<rpc_errc, std::string>> admission(const MethodEntry& m,
                                                          ServerShared& shared,
                                                          const PeerId& remote) {
  if (shared.active_calls >= m.max_concurrent_calls)
    return std::pair{rpc_errc::unavailable, std::string("server busy: too many calls in progress")};
  if (m.max_calls_per_peer == 0) return std::nullopt;
  auto it = shared.calls_by_peer.find(remote);
  if (it == shared.calls_by_peer.end() || it->second < m.max_calls_per_peer) return std::nullopt;
  ++shared.refused_per_peer;
  return std::pair{rpc_errc::resource_exhausted,
                   "too many calls from this peer (" + std::to_string(it->second) +
                       " in progress, limit " + std::to_string(m.max_calls_per_peer) + ")"};
}

}  // namespace

awaitable<void> serve_stream(std::shared_ptr<const MethodEntry> m,
                             std::shared_ptr<ServerShared> shared, ByteStreamPtr stream,
                             PeerId remote) {
  auto log = logger("net");
  const std::string desc = "rpc " + m->protocol + " from " + remote.short_string();
  ServerCall call(std::move(stream), m->max_message_size, m->max_message_size);
  auto cancelled = [](const asio::cancellation_state& cs) {
    return cs.cancelled() != asio::cancellation_type::none;
  };

  // A refused call is answered at once and not counted, so refusals cannot crowd out calls.
  if (auto refusal = admission(*m, *shared, remote)) {
    if (auto n = shared->refusal_log.note(Clock::now()))
      log->warn("{}: refused: {} ({} call(s) refused since the last such line)", desc,
                refusal->second, n);
    co_await call.finish(static_cast<std::uint32_t>(refusal->first), refusal->second, m->linger);
    co_return;
  }
  ActiveGuard active(shared, remote);

  // 1. Request header.
  auto hdr = co_await run_until(call.read_header(), Clock::now() + m->header_timeout,
                                "waiting for the request header");
  if (!hdr) {
    const auto& e = hdr.error();
    if (cancelled(co_await asio::this_coro::cancellation_state) || e == errc::cancelled ||
        e == errc::closed || e == errc::reset) {
      log->debug("{}: ended before the header: {}", desc, e.message());
      call.reset();
      co_return;
    }
    if (e == errc::timeout) {
      log->warn("{}: no request header within {} ms", desc, ms_string(m->header_timeout));
      call.reset();
      co_return;
    }
    log->warn("{}: rejected: {}", desc, e.message());
    active.release();
    co_await call.finish(static_cast<std::uint32_t>(to_rpc_code(e)), e.context(), m->linger);
    co_return;
  }
  Duration limit = m->max_duration;
  if (hdr.value().timeout_ms > 0) {
    auto asked = std::chrono::milliseconds(std::min<std::uint64_t>(
        hdr.value().timeout_ms,
        static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::milliseconds>(limit).count())));
    limit = std::min<Duration>(limit, asked);
  }
  const TimePoint deadline = Clock::now() + limit;
  if (hdr.value().max_response_size > 0)
    call.limit_response(static_cast<std::size_t>(
        std::min<std::uint64_t>(m->max_message_size, hdr.value().max_response_size)));
  RpcContext ctx(remote, m->protocol, deadline);

  // 2. The request (unary / server-streaming), within the call's deadline.
  result<void> outcome = success();
  if (m->kind != MethodKind::bidi) {
    auto req = co_await run_until(call.read_frame(), deadline, "waiting for the request");
    if (!req)
      outcome = req.error();
    else if (!req.value())
      outcome = make_error(errc::invalid_argument, "client closed the stream without a request");
    else
      call.first_request = std::move(*req.value());
  }

  // 3. The handler, under the deadline.
  if (outcome) outcome = co_await run_handler(m, ctx, call);
  if (cancelled(co_await asio::this_coro::cancellation_state)) {
    log->debug("{}: cancelled (server stopping)", desc);
    call.reset();
    co_return;
  }
  if (!outcome && call.broken() &&
      (outcome.error() == errc::reset || outcome.error() == errc::closed ||
       outcome.error() == errc::io || outcome.error() == errc::cancelled)) {
    log->debug("{}: client went away: {}", desc, outcome.error().message());
    call.reset();
    co_return;
  }

  // 4. Final status.
  active.release();
  if (outcome) {
    const std::string no_message;  // named: no temporaries in co_await (GCC 12)
    co_await call.finish(0, no_message, m->linger);
    co_return;
  }
  const auto& e = outcome.error();
  if (is_client_fault(e))
    log->warn("{}: bad request: {}", desc, e.message());
  else
    log->debug("{}: failed: {}", desc, e.message());
  auto code = to_rpc_code(e);
  std::string message = e.context().empty() ? e.code().message() : e.context();
  co_await call.finish(static_cast<std::uint32_t>(code), message, m->linger);
}

}  // namespace detail

// ---------------------------------------------------------------- RpcServer

RpcServer::RpcServer(StreamHost& host, RpcServerOptions opts)
    : host_(&host), opts_(opts), shared_(std::make_shared<detail::ServerShared>()) {}

RpcServer::~RpcServer() {
  for (const auto& p : protocols_) host_->remove_stream_handler(p);
}

void RpcServer::add_method(std::string protocol, detail::MethodKind kind, detail::Invoker invoke,
                           const MethodOptions& mo) {
  auto m = std::make_shared<detail::MethodEntry>();
  m->protocol = protocol;
  m->kind = kind;
  m->max_message_size = mo.max_message_size ? mo.max_message_size : opts_.max_message_size;
  m->max_duration =
      std::min<Duration>(mo.max_duration > Duration::zero() ? mo.max_duration : opts_.max_duration,
                         detail::kMaxTimeout);
  m->header_timeout = opts_.header_timeout;
  m->linger = opts_.linger;
  m->max_concurrent_calls = opts_.max_concurrent_calls;
  m->max_calls_per_peer = opts_.max_calls_per_peer;
  m->invoke = std::move(invoke);
  // A plain (non-coroutine) lambda forwarding to a coroutine with by-value parameters: the
  // call keeps what it needs even if the handler is replaced while it runs.
  host_->set_stream_handler(protocol, [m, shared = shared_](ByteStreamPtr s, PeerId remote) {
    return detail::serve_stream(m, shared, std::move(s), std::move(remote));
  });
  if (std::find(protocols_.begin(), protocols_.end(), protocol) == protocols_.end())
    protocols_.push_back(std::move(protocol));
}

void RpcServer::remove(const std::string& protocol) {
  host_->remove_stream_handler(protocol);
  protocols_.erase(std::remove(protocols_.begin(), protocols_.end(), protocol), protocols_.end());
}

}  // namespace starling::net
