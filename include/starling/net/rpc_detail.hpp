// Untyped machinery behind the typed RPC API in rpc.hpp: the client side of one call
// (ClientCall), the server side of one call (ServerCall), frame codecs and method entries.
// Users include rpc.hpp; this header is public only because the templates there need it (and
// the fuzz target drives these classes directly).
//
// Threading rule: everything here belongs to the executor of the stream it runs on; use it
// only from coroutines on that executor. A call allows one read and one write in flight at a
// time (a reader coroutine and a writer coroutine may run concurrently).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/this_coro.hpp>
#include "starling/core/timer.hpp"

#include "starling/core/async.hpp"
#include "starling/core/bytes.hpp"
#include "starling/net/byte_stream.hpp"
#include "starling/net/log_throttle.hpp"
#include "starling/net/peer_id.hpp"
#include "starling/net/stream_host.hpp"

namespace google::protobuf {
class MessageLite;
}

namespace starling::net {

class RpcContext;
struct CallOptions;

namespace detail {

// Extra bytes the response envelope adds around a payload (tag + length varint), and the
// smallest frame limit a reader uses (so a status frame always fits).
inline constexpr std::size_t kEnvelopeOverhead = 11;
inline constexpr std::size_t kMinFrameLimit = 64 * 1024;
inline constexpr std::size_t kMaxHeaderSize = 1024;
inline constexpr std::size_t kMaxStatusMessage = 4096;
// Longer timeouts are cut to this (so deadlines never overflow the clock).
inline constexpr Duration kMaxTimeout = std::chrono::hours(24 * 365);

// ---- frame codecs (pure functions; fuzzed) ----

// Encodes `msg` as a length-prefixed response payload frame. errc::too_large (naming `what`,
// e.g. "response") if the message exceeds `limit`.
result<Bytes> encode_payload_frame(const google::protobuf::MessageLite& msg, std::size_t limit,
                                   const char* what);
// Encodes `msg` as a plain length-prefixed frame (what the client sends).
result<Bytes> encode_message_frame(const google::protobuf::MessageLite& msg, std::size_t limit,
                                   const char* what);
// Encodes the final status frame (length-prefixed). The message is cut to kMaxStatusMessage
// bytes and made valid UTF-8.
Bytes encode_status_frame(std::uint32_t code, std::string_view message);
Bytes encode_header_frame(std::uint64_t timeout_ms, std::uint64_t max_response_size);

// One decoded server frame (without its length prefix).
struct ResponseFrame {
  bool is_status = false;
  std::uint32_t code = 0;  // status only
  std::string message;     // status only
  // The payload (payload frames only). Points into the decoded frame or into this object:
  // valid while both live.
  BytesView payload() const { return owned_ ? as_bytes(*owned_) : view_; }

  BytesView view_;
  std::optional<std::string> owned_;  // set when the envelope needed a full protobuf parse
};
// Decodes a response envelope. errc::invalid_argument for malformed protobuf,
// errc::protocol_violation for an envelope with neither payload nor status.
result<ResponseFrame> decode_response_frame(BytesView frame);

struct RequestHeader {
  std::uint64_t timeout_ms = 0;
  std::uint64_t max_response_size = 0;
};
result<RequestHeader> decode_header(BytesView frame);

// Reads a frame's length prefix. std::nullopt when the stream ended cleanly at a frame boundary
// (errc::closed from the transport); errc::protocol_violation if it ended inside a prefix.
awaitable<result<std::optional<std::uint64_t>>> read_frame_length(BufferedReader& r);
// Reads a frame body of `n` bytes; errc::protocol_violation if the stream ends inside it.
awaitable<result<Bytes>> read_frame_body(BufferedReader& r, std::size_t n);
// Size of the payload inside a response frame of `frame_len` bytes holding one payload field.
std::uint64_t payload_size_of_frame(std::uint64_t frame_len);

// Parses `bytes` into `out`; errc::invalid_argument naming `what` on failure.
result<void> parse_message(BytesView bytes, google::protobuf::MessageLite& out, const char* what);
// errc::too_large "<what> message of N bytes exceeds limit M" if msg is bigger than `limit`.
result<void> check_message_size(const google::protobuf::MessageLite& msg, std::size_t limit,
                                const char* what);

// Runs `op` until `deadline`: errc::timeout (context `what`) if the deadline passes first,
// errc::cancelled if the calling coroutine was cancelled; `op` is cancelled in both cases.
template <class T>
awaitable<result<T>> run_until(awaitable<result<T>> op, TimePoint deadline, std::string what) {
  using namespace asio::experimental::awaitable_operators;
  Timer timer(co_await asio::this_coro::executor, deadline);
  auto r = co_await (std::move(op) || timer.async_wait(use_nothrow));
  auto cs = co_await asio::this_coro::cancellation_state;
  if (cs.cancelled() != asio::cancellation_type::none)
    co_return make_error(errc::cancelled, std::move(what));
  if (r.index() == 0) co_return std::move(std::get<0>(r));
  co_return make_error(errc::timeout, std::move(what));
}

// ---- message source / sink seen by typed readers and writers ----

class MessageSource {
 public:
  virtual ~MessageSource() = default;
  // Reads the next message into `out`. false: the other side finished (no more messages).
  virtual awaitable<result<bool>> read_message(google::protobuf::MessageLite& out) = 0;
};

class MessageSink {
 public:
  virtual ~MessageSink() = default;
  virtual awaitable<result<void>> write_message(const google::protobuf::MessageLite& msg) = 0;
};

// ---- client side of one call ----

// Owns the stream of one outgoing call and its deadline. A deadline timer resets the stream
// when the call's time is up, so every pending read/write fails at once and reports
// errc::timeout. Any failure resets the stream; destroying an unfinished call resets it too.
class ClientCall final : public MessageSource,
                         public MessageSink,
                         public std::enable_shared_from_this<ClientCall> {
 public:
  // Opens a stream to `peer` for `protocol` within the call's deadline. An unknown protocol
  // (errc::unsupported from the host) becomes rpc_errc::unimplemented.
  static awaitable<result<std::shared_ptr<ClientCall>>> open(StreamHost& host, PeerId peer,
                                                             std::string protocol,
                                                             const CallOptions& opts);
  // A call over an already-negotiated stream (tests, fuzzing).
  static std::shared_ptr<ClientCall> attach(ByteStreamPtr stream, PeerId peer, std::string protocol,
                                            const CallOptions& opts);
  ~ClientCall() override;
  ClientCall(const ClientCall&) = delete;
  ClientCall& operator=(const ClientCall&) = delete;

  // Sends the request header now (otherwise it goes out with the first message).
  awaitable<result<void>> send_header();
  // Sends one request message (the header first if not sent yet). If the server already
  // ended the call with an error status, returns that status instead of the write error.
  awaitable<result<void>> write_message(const google::protobuf::MessageLite& msg) override;
  // Half-closes the request direction (bidi: no more requests).
  awaitable<result<void>> close_write();
  // Reads the next response. true: `out` holds a message; false: the server finished with OK
  // status. An error status becomes an Error in rpc_category() whose context names the peer,
  // the protocol and the remote message.
  awaitable<result<bool>> read_message(google::protobuf::MessageLite& out) override;
  // Expects the final status next (unary: after the one response).
  awaitable<result<void>> finish();
  // Aborts the call: resets the stream. Idempotent.
  void cancel();
  bool done() const noexcept { return finished_; }
  // "rpc /proto to 12D3Ko…abcdef"
  const std::string& describe() const noexcept { return describe_; }
  // Fails the call with protocol_violation (for typed wrappers that see a shape error).
  Error fail_protocol(const std::string& why);

  // Use open()/attach().
  ClientCall(ByteStreamPtr stream, PeerId peer, std::string protocol, TimePoint deadline,
             Duration timeout, std::size_t max_message_size);

 private:
  struct Incoming {
    Bytes raw;
    ResponseFrame frame;  // views into raw
  };
  void arm_deadline();
  Error fail(Error e);
  awaitable<result<Incoming>> read_frame();
  awaitable<result<bool>> end_with_status(std::uint32_t code, std::string message);
  awaitable<result<void>> write_frame(Bytes frame);
  awaitable<std::optional<Error>> read_status_after_write_error();

  ByteStreamPtr stream_;
  BufferedReader reader_;
  PeerId peer_;
  std::string protocol_;
  std::string describe_;
  TimePoint deadline_;
  Duration timeout_;
  std::size_t max_message_size_;
  Timer timer_;
  bool header_sent_ = false;
  bool write_closed_ = false;
  bool finished_ = false;
  bool finished_ok_ = false;
  bool timed_out_ = false;
};

// ---- server side ----

enum class MethodKind { unary, server_streaming, bidi };

// The server side of one call, as seen by handlers (through RpcReader / RpcWriter).
class ServerCall final : public MessageSource, public MessageSink {
 public:
  ServerCall(ByteStreamPtr stream, std::size_t max_request, std::size_t max_response);
  ~ServerCall() override;  // resets the stream unless the call ended cleanly
  ServerCall(const ServerCall&) = delete;
  ServerCall& operator=(const ServerCall&) = delete;

  awaitable<result<RequestHeader>> read_header();
  // Reads one request frame (size-checked, not parsed).
  awaitable<result<std::optional<Bytes>>> read_frame();
  awaitable<result<bool>> read_message(google::protobuf::MessageLite& out) override;
  awaitable<result<void>> write_message(const google::protobuf::MessageLite& msg) override;
  // Unary / server-streaming: watches the stream after the request while the handler runs.
  // Completes only on trouble: errc::reset (the client reset the stream: cancel the
  // handler) or errc::protocol_violation (data after the request). A clean half-close by the
  // client is accepted and watching continues until cancelled.
  awaitable<result<void>> watch();
  // Sends the final status, half-closes, then drains what the client still sends until its
  // half-close (bounded by `linger` and a byte budget); resets the stream if that fails.
  awaitable<void> finish(std::uint32_t code, std::string_view message, Duration linger);
  void reset();
  bool broken() const noexcept { return broken_; }
  void limit_response(std::size_t n) { max_response_ = n; }

  Bytes first_request;  // unary / server-streaming: the request frame read before the handler

 private:
  ByteStreamPtr stream_;
  BufferedReader reader_;
  std::size_t max_request_;
  std::size_t max_response_;
  bool client_closed_ = false;
  bool broken_ = false;        // out of step or reset: no more reads
  bool write_broken_ = false;  // a write failed: no more writes either
  bool finished_ = false;
};

using Invoker = std::function<awaitable<result<void>>(const RpcContext&, ServerCall&)>;

struct MethodEntry {
  std::string protocol;
  MethodKind kind = MethodKind::unary;
  std::size_t max_message_size = 0;
  Duration max_duration{};
  Duration header_timeout{};
  Duration linger{};
  std::size_t max_concurrent_calls = 0;
  std::size_t max_calls_per_peer = 0;  // 0: no per-peer bound
  Invoker invoke;
};

// Shared by the server and its running calls (they may outlive the RpcServer object).
struct ServerShared {
  std::size_t active_calls = 0;
  std::map<PeerId, std::size_t> calls_by_peer;  // calls being served, per remote peer
  std::uint64_t refused_per_peer = 0;
  LogThrottle refusal_log{std::chrono::seconds(10)};
};

// Serves one inbound stream for method `m`: header, request, handler under the deadline,
// final status. Never throws for bad input; cancels the handler when the deadline passes,
// the client resets the stream, or this coroutine is cancelled.
awaitable<void> serve_stream(std::shared_ptr<const MethodEntry> m,
                             std::shared_ptr<ServerShared> shared, ByteStreamPtr stream,
                             PeerId remote);

}  // namespace detail
}  // namespace starling::net
