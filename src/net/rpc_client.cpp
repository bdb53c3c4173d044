// Client side of one RPC call: open the stream, send header and requests, read responses and
// the final status, all under one deadline; reset the stream on any failure.
#include <algorithm>

#include "starling/core/log.hpp"
#include "starling/net/rpc.hpp"

namespace starling::net::detail {

namespace {

std::string ms_string(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

std::string call_description(const std::string& protocol, const PeerId& peer) {
  return "rpc " + protocol + " to " + peer.short_string();
}

// Error for a final status: the remote code in rpc_category(), the remote's message prefixed
// with the call description.
Error status_error(std::uint32_t code, const std::string& message, const std::string& describe) {
  auto c = code <= static_cast<std::uint32_t>(rpc_errc::unavailable) ? static_cast<rpc_errc>(code)
                                                                     : rpc_errc::unknown;
  std::string text = message.empty() ? rpc_category().message(static_cast<int>(code)) : message;
  if (c == rpc_errc::unknown && code != static_cast<std::uint32_t>(rpc_errc::unknown))
    text = "status code " + std::to_string(code) + ": " + text;
  return Error(make_error_code(c), describe + ": " + text);
}

}  // namespace

ClientCall::ClientCall(ByteStreamPtr stream, PeerId peer, std::string protocol, TimePoint deadline,
                       Duration timeout, std::size_t max_message_size)
    : stream_(std::move(stream)),
      reader_(*stream_),
      peer_(std::move(peer)),
      protocol_(std::move(protocol)),
      describe_(call_description(protocol_, peer_)),
      deadline_(deadline),
      timeout_(timeout),
      max_message_size_(max_message_size),
      timer_(stream_->get_executor()) {}

ClientCall::~ClientCall() {
  if (!finished_) stream_->reset();
}

awaitable<result<std::shared_ptr<ClientCall>>> ClientCall::open(StreamHost& host, PeerId peer,
                                                                std::string protocol,
                                                                const CallOptions& opts) {
  auto describe = call_description(protocol, peer);
  if (opts.timeout <= Duration::zero())
    co_return make_error(errc::timeout, describe + ": no time left for the call");
  const Duration timeout = std::min(opts.timeout, kMaxTimeout);
  auto deadline = Clock::now() + timeout;
  auto opened = co_await run_until(host.open_stream(peer, protocol, timeout), deadline,
                                   describe + ": opening stream");
  if (!opened) {
    const auto& e = opened.error();
    if (e == errc::timeout)
      co_return make_error(errc::timeout, describe + ": deadline of " + ms_string(timeout) +
                                              " ms exceeded while opening the stream");
    if (e == errc::unsupported)
      co_return Error(make_error_code(rpc_errc::unimplemented),
                      describe + ": protocol not supported by the peer" +
                          (e.context().empty() ? "" : " (" + e.context() + ")"));
    co_return e.with_context(describe);
  }
  auto call =
      std::make_shared<ClientCall>(std::move(opened).value(), std::move(peer), std::move(protocol),
                                   deadline, timeout, opts.max_message_size);
  call->arm_deadline();
  co_return call;
}

std::shared_ptr<ClientCall> ClientCall::attach(ByteStreamPtr stream, PeerId peer,
                                               std::string protocol, const CallOptions& opts) {
  const Duration timeout = std::clamp(opts.timeout, Duration::zero(), kMaxTimeout);
  auto call = std::make_shared<ClientCall>(std::move(stream), std::move(peer), std::move(protocol),
                                           Clock::now() + timeout, timeout, opts.max_message_size);
  call->arm_deadline();
  return call;
}

void ClientCall::arm_deadline() {
  timer_.expires_at(deadline_);
  timer_.async_wait([weak = weak_from_this()](std::error_code ec) {
    if (ec) return;
    auto self = weak.lock();
    if (!self || self->finished_) return;
    // Time is up: reset the stream so every pending read/write of this call fails now;
    // fail() reports them as errc::timeout.
    self->timed_out_ = true;
    self->stream_->reset();
  });
}

Error ClientCall::fail(Error e) {
  if (timed_out_)
    e = Error(errc::timeout, describe_ + ": deadline of " + ms_string(timeout_) + " ms exceeded");
  else if (e == errc::cancelled)
    e = Error(errc::cancelled, describe_ + ": cancelled");
  else if (e == errc::unsupported)  // a lazily negotiated stream refused ("na") on first read
    e = Error(make_error_code(rpc_errc::unimplemented),
              describe_ + ": protocol not supported by the peer (" + e.message() + ")");
  else if (!is_remote_error(e))
    e = e.with_context(describe_);
  if (!finished_) {
    finished_ = true;
    stream_->reset();
    timer_.cancel();
  }
  return e;
}

Error ClientCall::fail_protocol(const std::string& why) {
  logger("net")->warn("{}: {}", describe_, why);
  return fail(make_error(errc::protocol_violation, why));
}

void ClientCall::cancel() {
  if (finished_) return;
  finished_ = true;
  stream_->reset();
  timer_.cancel();
}

awaitable<result<void>> ClientCall::write_frame(Bytes frame) {
  if (finished_) co_return make_error(errc::closed, describe_ + ": call already finished");
  if (write_closed_) co_return make_error(errc::closed, describe_ + ": request side closed");
  if (!header_sent_) {
    auto remaining = deadline_ - Clock::now();
    if (remaining <= Duration::zero()) {
      timed_out_ = true;
      co_return fail(make_error(errc::timeout));
    }
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(remaining).count();
    Bytes header = encode_header_frame(static_cast<std::uint64_t>(ms), max_message_size_);
    frame.insert(frame.begin(), header.begin(), header.end());
    header_sent_ = true;
  }
  auto w = co_await stream_->write(frame);
  if (w) co_return success();
  auto cs = co_await asio::this_coro::cancellation_state;
  if (timed_out_ || w.error() == errc::cancelled || cs.cancelled() != asio::cancellation_type::none)
    co_return fail(w.error());
  // The server may have ended the call already (e.g. it refused an oversized request): its
  // status explains the failure better than the write error.
  auto st = co_await read_status_after_write_error();
  if (st) co_return *st;
  co_return fail(w.error());
}

awaitable<std::optional<Error>> ClientCall::read_status_after_write_error() {
  std::size_t frame_limit = std::max(max_message_size_ + kEnvelopeOverhead, kMinFrameLimit);
  for (;;) {
    auto len = co_await read_frame_length(reader_);
    if (!len || !len.value() || *len.value() > frame_limit) co_return std::nullopt;
    auto raw = co_await read_frame_body(reader_, static_cast<std::size_t>(*len.value()));
    if (!raw) co_return std::nullopt;
    auto f = decode_response_frame(raw.value());
    if (!f) co_return std::nullopt;
    if (!f.value().is_status) continue;
    if (f.value().code == 0) co_return std::nullopt;
    co_return fail(status_error(f.value().code, f.value().message, describe_));
  }
}

awaitable<result<void>> ClientCall::send_header() {
  if (header_sent_) co_return success();
  const Bytes empty;  // named: no temporaries in co_await (GCC 12)
  co_return co_await write_frame(empty);
}

awaitable<result<void>> ClientCall::write_message(const google::protobuf::MessageLite& msg) {
  // An oversized request is refused before anything is sent; the call stays usable.
  auto frame = encode_message_frame(msg, max_message_size_, "request");
  if (!frame) co_return frame.error().with_context(describe_);
  co_return co_await write_frame(std::move(frame).value());
}

awaitable<result<void>> ClientCall::close_write() {
  if (finished_ || write_closed_) co_return success();
  if (!header_sent_) ST_CO_TRY(co_await send_header());
  auto r = co_await stream_->close_write();
  if (!r) co_return fail(r.error());
  write_closed_ = true;
  co_return success();
}

awaitable<result<ClientCall::Incoming>> ClientCall::read_frame() {
  if (finished_) co_return make_error(errc::closed, describe_ + ": call already finished");
  auto len = co_await read_frame_length(reader_);
  if (!len) co_return fail(len.error());
  if (!len.value())
    co_return fail(make_error(errc::closed, "stream closed before the final status"));
  std::uint64_t n = *len.value();
  std::size_t frame_limit = std::max(max_message_size_ + kEnvelopeOverhead, kMinFrameLimit);
  if (n > frame_limit) {
    auto e = make_error(errc::too_large,
                        "response message of " + std::to_string(payload_size_of_frame(n)) +
                            " bytes exceeds limit " + std::to_string(max_message_size_));
    logger("net")->warn("{}: {}", describe_, e.context());
    co_return fail(std::move(e));
  }
  Incoming in;
  auto raw = co_await read_frame_body(reader_, static_cast<std::size_t>(n));
  if (!raw) co_return fail(raw.error());
  in.raw = std::move(raw).value();
  auto f = decode_response_frame(in.raw);
  if (!f) {
    logger("net")->warn("{}: {}", describe_, f.error().message());
    co_return fail(f.error());
  }
  in.frame = std::move(f).value();
  co_return in;
}

awaitable<result<bool>> ClientCall::end_with_status(std::uint32_t code, std::string message) {
  // Say goodbye (half-close) while the deadline timer still guards the write.
  if (!write_closed_) {
    (void)co_await stream_->close_write();
    write_closed_ = true;
  }
  finished_ = true;
  timer_.cancel();
  if (code != 0) co_return status_error(code, message, describe_);
  finished_ok_ = true;
  co_return false;
}

awaitable<result<bool>> ClientCall::read_message(google::protobuf::MessageLite& out) {
  if (finished_ok_) co_return false;
  ST_CO_TRY(auto in, co_await read_frame());
  if (in.frame.is_status) co_return co_await end_with_status(in.frame.code, in.frame.message);
  auto payload = in.frame.payload();
  if (payload.size() > max_message_size_) {
    auto e = make_error(errc::too_large, "response message of " + std::to_string(payload.size()) +
                                             " bytes exceeds limit " +
                                             std::to_string(max_message_size_));
    logger("net")->warn("{}: {}", describe_, e.context());
    co_return fail(std::move(e));
  }
  auto parsed = parse_message(payload, out, "response");
  if (!parsed) {
    logger("net")->warn("{}: {}", describe_, parsed.error().message());
    co_return fail(parsed.error());
  }
  co_return true;
}

awaitable<result<void>> ClientCall::finish() {
  if (finished_ok_) co_return success();
  ST_CO_TRY(auto in, co_await read_frame());
  if (!in.frame.is_status) co_return fail_protocol("unary call got more than one response");
  ST_CO_TRY(co_await end_with_status(in.frame.code, in.frame.message));
  co_return success();
}

}  // namespace starling::net::detail
