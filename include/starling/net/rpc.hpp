// Typed RPC over libp2p streams: unary, server-streaming and bidirectional-streaming calls
// with protobuf messages, deadlines, cancellation and size limits, on any StreamHost.
//
// Threading rule: RpcServer, RpcClient and every call object belong to the host's executor
// (the node's io thread); use them only from coroutines running there. Non-coroutine callers
// use BlockingRpcClient (rpc_blocking.hpp).
//
// WIRE FORMAT (one call = one stream; all frames are uvarint-length-prefixed, libp2p style)
//   The stream is negotiated (multistream-select) to the method's protocol id, e.g.
//   "/starling/echo/1.0.0"; the protocol id is the method name.
//   client -> server:
//     frame RpcRequestHeader { timeout_ms, max_response_size }   (proto/rpc.proto)
//     frame request message                  (unary / server-streaming: exactly one;
//     frame request message ...               bidi: any number)
//     half-close of the write side. Unary and server-streaming clients half-close after they
//     read the final status (so a reset before that tells the server the client gave up);
//     bidi clients half-close when they have no more requests.
//   server -> client:
//     frame RpcResponseFrame { payload = serialized response }   (unary: exactly one)
//     ...
//     frame RpcResponseFrame { status = RpcStatus { code, message } }   (always last)
//     half-close; then the server reads (and discards) until the client's half-close.
//   timeout_ms is relative (never wall-clock time): the server runs the handler until
//   min(now + timeout_ms, its own cap) and cancels it then, or as soon as the stream is reset.
//   Status codes use gRPC numbering (see rpc_errc). A message bigger than the receiver's
//   limit (default 4 MiB) is refused: the server answers RESOURCE_EXHAUSTED, the client
//   fails with errc::too_large; either side resets a stream that breaks the framing.
//
// ERRORS seen by a client:
//   errc::timeout       the call's deadline passed (CallOptions::timeout bounds open, write and
//                       read together); the stream was reset.
//   errc::cancelled     the calling coroutine was cancelled; the stream was reset.
//   errc::too_large     a request or response over max_message_size ("... message of N bytes
//                       exceeds limit M").
//   errc::invalid_argument / protocol_violation   the server sent garbage; stream reset, logged.
//   errc::reset / closed / unavailable            transport trouble (peer died, no route).
//   rpc_category() codes                          the server's status: its handler's error,
//                       mapped by to_rpc_code(); context "rpc <protocol> to <peer>: <message>".
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <google/protobuf/message_lite.h>

#include "starling/core/async.hpp"
#include "starling/net/peer_id.hpp"
#include "starling/net/rpc_detail.hpp"
#include "starling/net/stream_host.hpp"

namespace starling::net {

// ---------------------------------------------------------------- errors

// Status codes carried on the wire (gRPC numbering). As std::error_code they live in
// rpc_category(), so a remote failure is never confused with a local one.
enum class rpc_errc {
  ok = 0,
  cancelled = 1,
  unknown = 2,
  invalid_argument = 3,
  deadline_exceeded = 4,
  not_found = 5,
  already_exists = 6,
  permission_denied = 7,
  resource_exhausted = 8,
  failed_precondition = 9,
  aborted = 10,
  out_of_range = 11,
  unimplemented = 12,  // also: the peer does not speak the method's protocol
  internal = 13,       // also: the handler threw
  unavailable = 14,
};
const std::error_category& rpc_category() noexcept;
inline std::error_code make_error_code(rpc_errc e) noexcept {
  return {static_cast<int>(e), rpc_category()};
}

}  // namespace starling::net

template <>
struct std::is_error_code_enum<starling::net::rpc_errc> : std::true_type {};

namespace starling::net {

// The status code a server sends for a handler error: rpc_category() codes pass through,
// starling errc values map to their meaning (timeout -> deadline_exceeded, too_large ->
// resource_exhausted, unsupported -> unimplemented, closed/reset/io -> unavailable, ...),
// anything else -> unknown.
rpc_errc to_rpc_code(const Error& e);
// The generic meaning of a remote code (deadline_exceeded -> errc::timeout, ...), for callers
// that branch on errc regardless of where the failure happened.
errc to_errc(rpc_errc code);
// True if `e` is a status returned by a remote server (rpc_category()).
bool is_remote_error(const Error& e);
// errc meaning of any error: to_errc() for remote errors, the errc itself for core errors.
errc generic_errc(const Error& e);

// ---------------------------------------------------------------- options

inline constexpr std::size_t kDefaultMaxMessageSize = 4 * 1024 * 1024;

// Per-call options (client side).
struct CallOptions {
  Duration timeout = 30s;  // bounds the whole call: open, writes, reads
  std::size_t max_message_size = kDefaultMaxMessageSize;  // requests and responses
};

// Per-method options (server side); zero means "use the server's default".
struct MethodOptions {
  std::size_t max_message_size = 0;
  Duration max_duration{};  // cap on the handler's run time, whatever the client asks for
};

struct RpcServerOptions {
  std::size_t max_message_size = kDefaultMaxMessageSize;
  Duration max_duration = 10min;  // cap on any call
  Duration header_timeout = 10s;  // to receive the header (and the request) after open
  Duration linger = 2s;           // after the final status, to wait for the client to close
  std::size_t max_concurrent_calls = 4096;  // more get UNAVAILABLE
  // Calls served at once for one remote peer (all methods together; 0: no bound). More are
  // answered RESOURCE_EXHAUSTED at once (logged at most every 10 s), so one peer cannot
  // take all of max_concurrent_calls and the server stays responsive to the others.
  std::size_t max_calls_per_peer = 256;
};

// What a handler knows about its call.
class RpcContext {
 public:
  RpcContext(PeerId remote, std::string protocol, TimePoint deadline)
      : remote_(std::move(remote)), protocol_(std::move(protocol)), deadline_(deadline) {}
  const PeerId& remote() const noexcept { return remote_; }
  const std::string& protocol() const noexcept { return protocol_; }
  TimePoint deadline() const noexcept { return deadline_; }
  // Time left before the handler is cancelled (never negative).
  Duration remaining() const {
    auto r = deadline_ - Clock::now();
    return r > Duration::zero() ? r : Duration::zero();
  }

 private:
  PeerId remote_;
  std::string protocol_;
  TimePoint deadline_;
};

// ---------------------------------------------------------------- typed streams

// Reads messages of type T from a call (server: requests; client bidi: responses).
template <class T>
class RpcReader {
 public:
  explicit RpcReader(detail::MessageSource& src, std::shared_ptr<void> keep = {})
      : src_(&src), keep_(std::move(keep)) {}
  // The next message; std::nullopt when the other side finished sending.
  awaitable<result<std::optional<T>>> read() {
    T msg;
    auto got = co_await src_->read_message(msg);
    if (!got) co_return got.error();
    if (!got.value()) co_return std::optional<T>{};
    co_return std::optional<T>(std::move(msg));
  }

 private:
  detail::MessageSource* src_;
  std::shared_ptr<void> keep_;
};

// Writes messages of type T to a call (server: responses; client bidi: requests).
template <class T>
class RpcWriter {
 public:
  explicit RpcWriter(detail::MessageSink& sink, std::shared_ptr<void> keep = {})
      : sink_(&sink), keep_(std::move(keep)) {}
  awaitable<result<void>> write(const T& msg) { return sink_->write_message(msg); }

 private:
  detail::MessageSink* sink_;
  std::shared_ptr<void> keep_;
};

// Client side of a server-streaming call: read() until std::nullopt (server finished OK) or
// an error. Destroying it before the end cancels the call (resets the stream).
template <class Resp>
class RpcClientStream {
 public:
  explicit RpcClientStream(std::shared_ptr<detail::ClientCall> call) : call_(std::move(call)) {}
  awaitable<result<std::optional<Resp>>> read() {
    Resp msg;
    auto got = co_await call_->read_message(msg);
    if (!got) co_return got.error();
    if (!got.value()) co_return std::optional<Resp>{};
    co_return std::optional<Resp>(std::move(msg));
  }
  void cancel() { call_->cancel(); }
  bool done() const noexcept { return call_->done(); }

 private:
  std::shared_ptr<detail::ClientCall> call_;
};

// Client side of a bidirectional call. One coroutine may write while another reads.
// close_write() says "no more requests"; read() returns std::nullopt when the server finished
// OK. Destroying it before the end cancels the call.
template <class Req, class Resp>
class RpcBidiCall {
 public:
  explicit RpcBidiCall(std::shared_ptr<detail::ClientCall> call)
      : call_(std::move(call)), reader_(*call_, call_), writer_(*call_, call_) {}
  awaitable<result<void>> write(const Req& msg) { return writer_.write(msg); }
  awaitable<result<void>> close_write() { return call_->close_write(); }
  awaitable<result<std::optional<Resp>>> read() { return reader_.read(); }
  RpcReader<Resp>& reader() noexcept { return reader_; }
  RpcWriter<Req>& writer() noexcept { return writer_; }
  void cancel() { call_->cancel(); }
  bool done() const noexcept { return call_->done(); }

 private:
  std::shared_ptr<detail::ClientCall> call_;
  RpcReader<Resp> reader_;
  RpcWriter<Req> writer_;
};

// ---------------------------------------------------------------- client

class RpcClient {
 public:
  explicit RpcClient(StreamHost& host) : host_(&host) {}
  StreamHost& host() const noexcept { return *host_; }

  // One request, one response.
  template <class Req, class Resp>
  awaitable<result<Resp>> unary(PeerId peer, std::string protocol, Req req, CallOptions opts = {}) {
    ST_CO_TRY(detail::check_message_size(req, opts.max_message_size, "request"));
    ST_CO_TRY(auto call, co_await detail::ClientCall::open(*host_, std::move(peer),
                                                           std::move(protocol), opts));
    ST_CO_TRY(co_await call->write_message(req));
    Resp resp;
    ST_CO_TRY(auto got, co_await call->read_message(resp));
    if (!got) co_return call->fail_protocol("server finished a unary call without a response");
    ST_CO_TRY(co_await call->finish());
    co_return resp;
  }

  // One request, a stream of responses.
  template <class Req, class Resp>
  awaitable<result<RpcClientStream<Resp>>> server_streaming(PeerId peer, std::string protocol,
                                                            Req req, CallOptions opts = {}) {
    ST_CO_TRY(detail::check_message_size(req, opts.max_message_size, "request"));
    ST_CO_TRY(auto call, co_await detail::ClientCall::open(*host_, std::move(peer),
                                                           std::move(protocol), opts));
    ST_CO_TRY(co_await call->write_message(req));
    co_return RpcClientStream<Resp>(std::move(call));
  }

  // Server-streaming with a callback per response; an error from `on_message` cancels the
  // call and is returned.
  template <class Req, class Resp>
  awaitable<result<void>> server_streaming_each(PeerId peer, std::string protocol, Req req,
                                                std::function<result<void>(Resp&&)> on_message,
                                                CallOptions opts = {}) {
    // (parenthesised: the template argument list has a comma)
    ST_CO_TRY(auto stream, (co_await server_streaming<Req, Resp>(
                               std::move(peer), std::move(protocol), std::move(req), opts)));
    for (;;) {
      ST_CO_TRY(auto msg, co_await stream.read());
      if (!msg) co_return success();
      auto r = on_message(std::move(*msg));
      if (!r) {
        stream.cancel();
        co_return r.error();
      }
    }
  }

  // Bidirectional streaming. The request header is sent at once.
  template <class Req, class Resp>
  awaitable<result<RpcBidiCall<Req, Resp>>> bidi(PeerId peer, std::string protocol,
                                                 CallOptions opts = {}) {
    ST_CO_TRY(auto call, co_await detail::ClientCall::open(*host_, std::move(peer),
                                                           std::move(protocol), opts));
    ST_CO_TRY(co_await call->send_header());
    co_return RpcBidiCall<Req, Resp>(std::move(call));
  }

 private:
  StreamHost* host_;
};

// ---------------------------------------------------------------- server

template <class Req, class Resp>
using UnaryHandler = std::function<awaitable<result<Resp>>(const RpcContext&, Req)>;
template <class Req, class Resp>
using ServerStreamingHandler =
    std::function<awaitable<result<void>>(const RpcContext&, Req, RpcWriter<Resp>&)>;
template <class Req, class Resp>
using BidiHandler =
    std::function<awaitable<result<void>>(const RpcContext&, RpcReader<Req>&, RpcWriter<Resp>&)>;

namespace detail {
template <class Req, class Resp>
awaitable<result<void>> run_unary(std::shared_ptr<UnaryHandler<Req, Resp>> h, const RpcContext& ctx,
                                  ServerCall& call) {
  Req req;
  ST_CO_TRY(parse_message(call.first_request, req, "request"));
  ST_CO_TRY(auto resp, co_await (*h)(ctx, std::move(req)));
  co_return co_await call.write_message(resp);
}

template <class Req, class Resp>
awaitable<result<void>> run_server_streaming(std::shared_ptr<ServerStreamingHandler<Req, Resp>> h,
                                             const RpcContext& ctx, ServerCall& call) {
  Req req;
  ST_CO_TRY(parse_message(call.first_request, req, "request"));
  RpcWriter<Resp> writer(call);
  co_return co_await (*h)(ctx, std::move(req), writer);
}

template <class Req, class Resp>
awaitable<result<void>> run_bidi(std::shared_ptr<BidiHandler<Req, Resp>> h, const RpcContext& ctx,
                                 ServerCall& call) {
  RpcReader<Req> reader(call);
  RpcWriter<Resp> writer(call);
  co_return co_await (*h)(ctx, reader, writer);
}
}  // namespace detail

// Serves methods on a StreamHost: one protocol id per method. Handlers run on the host's
// executor inside the host's task scope; a handler's error is sent to the client as a status,
// a thrown exception as INTERNAL. Destroying the server unregisters its protocols; calls in
// flight finish on their own (they do not reference the server).
class RpcServer {
 public:
  explicit RpcServer(StreamHost& host, RpcServerOptions opts = {});
  ~RpcServer();
  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;

  template <class Req, class Resp>
  void add_unary(std::string protocol, UnaryHandler<Req, Resp> handler, MethodOptions mo = {}) {
    auto h = std::make_shared<UnaryHandler<Req, Resp>>(std::move(handler));
    add_method(
        std::move(protocol), detail::MethodKind::unary,
        [h](const RpcContext& ctx, detail::ServerCall& call) {
          return detail::run_unary<Req, Resp>(h, ctx, call);
        },
        mo);
  }

  template <class Req, class Resp>
  void add_server_streaming(std::string protocol, ServerStreamingHandler<Req, Resp> handler,
                            MethodOptions mo = {}) {
    auto h = std::make_shared<ServerStreamingHandler<Req, Resp>>(std::move(handler));
    add_method(
        std::move(protocol), detail::MethodKind::server_streaming,
        [h](const RpcContext& ctx, detail::ServerCall& call) {
          return detail::run_server_streaming<Req, Resp>(h, ctx, call);
        },
        mo);
  }

  template <class Req, class Resp>
  void add_bidi(std::string protocol, BidiHandler<Req, Resp> handler, MethodOptions mo = {}) {
    auto h = std::make_shared<BidiHandler<Req, Resp>>(std::move(handler));
    add_method(
        std::move(protocol), detail::MethodKind::bidi,
        [h](const RpcContext& ctx, detail::ServerCall& call) {
          return detail::run_bidi<Req, Resp>(h, ctx, call);
        },
        mo);
  }

  // Unregisters one method (calls in flight continue).
  void remove(const std::string& protocol);
  // Calls currently being served (all methods; refused ones are not counted).
  std::size_t active_calls() const noexcept { return shared_->active_calls; }
  // Calls being served for `peer`.
  std::size_t active_calls(const PeerId& peer) const {
    auto it = shared_->calls_by_peer.find(peer);
    return it == shared_->calls_by_peer.end() ? 0 : it->second;
  }
  // Calls refused because their peer was at max_calls_per_peer.
  std::uint64_t refused_per_peer() const noexcept { return shared_->refused_per_peer; }

 private:
  void add_method(std::string protocol, detail::MethodKind kind, detail::Invoker invoke,
                  const MethodOptions& mo);

  StreamHost* host_;
  RpcServerOptions opts_;
  std::shared_ptr<detail::ServerShared> shared_;
  std::vector<std::string> protocols_;
};

}  // namespace starling::net
