// Yamux stream multiplexer ("/yamux/1.0.0": hashicorp/yamux spec.md as adopted by libp2p) over
// any ByteStream (TCP, Noise). A YamuxSession turns one connection into many independent
// streams, each a ByteStream with its own flow control, half-close and reset.
//
// Threading rule: a session and its streams belong to the connection's executor (one thread);
// call them only from coroutines running on it. No locks.
//
// Wire behaviour (interop with go/js/rust libp2p):
//  - open_stream() sends the SYN at once (a window update, carrying any window above the
//    spec's 256 KiB); data may follow before the peer's ACK.
//  - accept_stream() sends the ACK when the application takes the stream (not when the SYN
//    arrives), so unaccepted streams give the opener back-pressure (libp2p's ACK backlog).
//  - Window updates are sent when the application has consumed half the receive window; the
//    window doubles (up to max_window, within a session memory budget) when updates come
//    faster than two round trips apart, so one stream can fill a long fat pipe.
//  - Misbehaving peers get GoAway(protocol error) and the session closes; nothing they send
//    can crash it or grow memory beyond the windows granted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "starling/net/byte_stream.hpp"

namespace starling::net {

inline constexpr std::string_view kYamuxProtocolId = "/yamux/1.0.0";

// Session configuration. Defaults suit a libp2p node on the internet.
struct YamuxConfig {
  // Receive window a stream starts with. The spec fixes 256 KiB as what both sides assume; a
  // larger value is announced in the SYN/ACK window update. Values below 256 KiB are raised.
  std::uint32_t initial_window = 256 * 1024;
  // Largest receive window auto-tuning may grow one stream's window to.
  std::uint32_t max_window = 16 * 1024 * 1024;
  // Memory budget for window growth above initial_window, summed over the session's streams.
  std::size_t session_window_budget = 64 * 1024 * 1024;
  // Grow receive windows when the peer is window-limited (see the top of this file).
  bool auto_tune_window = true;
  // Live streams (both directions, including unaccepted inbound ones). Inbound SYNs beyond
  // the limit are answered with RST; open_stream() fails with errc::unavailable.
  std::size_t max_streams = 1024;
  // Inbound streams waiting for accept_stream(); SYNs beyond it are answered with RST.
  std::size_t accept_backlog = 256;
  // ACK backlog: open_stream() waits while this many of our streams are unacknowledged...
  std::size_t max_unacked_outbound = 256;
  // ...but at most this long (then errc::timeout).
  Duration open_timeout = 10s;
  // Keepalive: yamux pings keep idle connections open through NATs and find dead ones. Both
  // sides ping once at start (an RTT sample for window auto-tuning). After that the dialer
  // (is_client) pings whenever no frame has arrived for keepalive_interval; the listener
  // probes only after keepalive_listener_idle without any inbound frame, so while the
  // dialer's pings (or any traffic) arrive it sends none. A probe not answered within
  // keepalive_timeout closes the session (errc::timeout, YamuxStats::keepalive_failures),
  // unless other frames arrived meanwhile (the pong may sit behind a long queue). 0 turns
  // that side's probes off. This also bounds every network wait of an idle session: a peer
  // that stops reading stops answering pings.
  Duration keepalive_interval = 30s;
  Duration keepalive_listener_idle = 40s;
  Duration keepalive_timeout = 10s;
  // close() waits this long for open streams to finish, then resets them; it returns within
  // this bound even if the peer never answers. Also bounds the socket linger after an error.
  Duration close_timeout = 5s;
  // Largest data frame payload we send (smaller frames interleave streams more finely).
  std::size_t max_frame_payload = 64 * 1024;
  // Bytes of frames queued for the connection before stream writes wait (the writer loop
  // sends everything queued in one write of the underlying connection).
  std::size_t write_buffer = 1024 * 1024;
  // Size of the buffer the reader loop reads the connection into.
  std::size_t read_buffer = 256 * 1024;
};

// GoAway codes (length field of a GoAway frame).
enum class YamuxGoAway : std::uint32_t { normal = 0, protocol_error = 1, internal_error = 2 };

// Counters of one session (for tests, metrics and the dashboard).
struct YamuxStats {
  std::size_t streams = 0;  // live streams now
  std::uint64_t streams_opened = 0;
  std::uint64_t streams_accepted = 0;  // inbound streams admitted (queued for accept)
  std::uint64_t streams_rejected = 0;  // inbound SYNs answered with RST
  std::uint64_t data_bytes_sent = 0;
  std::uint64_t data_bytes_received = 0;
  std::uint64_t data_bytes_direct = 0;  // of those: placed straight into a reader's buffer
  std::uint64_t frames_sent = 0;
  std::uint64_t frames_received = 0;
  std::uint64_t conn_writes = 0;          // writes of the underlying connection
  std::uint32_t largest_recv_window = 0;  // largest receive window any stream reached
  std::uint64_t window_growths = 0;       // receive-window doublings by auto-tuning
  std::size_t window_budget_used = 0;     // bytes of session_window_budget in use
  std::size_t window_budget_peak = 0;     // most of it ever in use at once
  Duration rtt{0};                        // smoothed ping RTT (0 before the first answer)
  std::uint64_t pings_sent = 0;           // every ping we sent (RTT, keepalive, ping())
  std::uint64_t pings_answered = 0;       // the peer's pings we answered
  std::uint64_t keepalive_probes = 0;     // pings sent because the connection was idle
  std::uint64_t keepalive_failures = 0;   // unanswered probes that closed the session
};

// Flow-control state of one yamux stream (diagnostics and tests).
struct YamuxStreamStats {
  std::uint32_t id = 0;
  std::uint32_t recv_window = 0;  // current receive window
  std::uint32_t recv_credit = 0;  // bytes the peer may still send
  std::size_t buffered = 0;       // received, not yet read by the application
  std::uint64_t send_credit = 0;  // bytes we may still send
  bool local_fin = false, remote_fin = false, reset = false;
};
// nullopt if `s` is not a yamux stream.
std::optional<YamuxStreamStats> yamux_stream_stats(const ByteStream& s);

namespace yamux {
class Session;
}

class YamuxSession {
 public:
  // `is_client`: the side that dialled (odd stream ids); the listener uses even ids.
  static std::shared_ptr<YamuxSession> create(ByteStreamPtr conn, bool is_client,
                                              YamuxConfig cfg = {});
  // Destroying the session without close() aborts it (GoAway, streams reset, socket closed).
  // Keep it alive as long as its streams are in use.
  ~YamuxSession();
  YamuxSession(const YamuxSession&) = delete;
  YamuxSession& operator=(const YamuxSession&) = delete;

  // Starts the reader, writer and keepalive loops (and an RTT-measuring ping).
  void start();
  // Opens an outbound stream; the SYN is queued immediately. errc::closed after close() or a
  // GoAway from the peer; errc::unavailable at max_streams; errc::timeout if the ACK backlog
  // does not drain within open_timeout.
  awaitable<result<ByteStreamPtr>> open_stream();
  // The next inbound stream (ACKed now). errc::closed once the session is closing or ended.
  awaitable<result<ByteStreamPtr>> accept_stream();
  // Round-trip time of a yamux ping; errc::timeout after `timeout`.
  awaitable<result<Duration>> ping(Duration timeout);
  // Sends GoAway(normal), lets open streams finish for up to close_timeout, then resets what
  // is left, flushes and half-closes the connection. Returns within close_timeout; waiting for
  // the peer's EOF and releasing the connection finish in the background within the same
  // bound (the connection is aborted if the peer does not close). Idempotent.
  awaitable<void> close();
  // True once the session stopped taking new streams (close() called or the session ended).
  bool closed() const;
  std::size_t stream_count() const;
  // Called once (posted to the executor) with why the session ended: errc::closed for a
  // normal close by either side, errc::timeout for a failed keepalive, errc::protocol_violation
  // for a misbehaving peer, errc::reset / io for a broken connection.
  void set_on_close(std::function<void(const Error&)> cb);
  YamuxStats stats() const;
  std::string describe() const;

 private:
  explicit YamuxSession(std::shared_ptr<yamux::Session> s);
  std::shared_ptr<yamux::Session> s_;
};

}  // namespace starling::net
