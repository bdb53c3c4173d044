// Internals of the yamux session (see include/starling/net/yamux.hpp for the behaviour).
// yamux::Session owns the connection and runs three loops in a TaskScope: the reader
// (yamux_reader.cpp: parses frames and dispatches them), the writer (yamux_writer.cpp: sends
// every queued frame in one write of the connection) and the keepalive (yamux_session.cpp).
// yamux::Stream (yamux_stream.cpp) is the ByteStream handed to the application.
//
// Threading rule: everything here runs on the connection's executor (one thread); frames are
// queued synchronously, so the state needs no locks.
//
// Ownership: the application owns streams (shared_ptr); each stream owns a shared_ptr to the
// session; the session's stream table holds plain pointers that a stream removes in its
// destructor. The loops hold the session alive until it has ended.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "net/yamux_buffer.hpp"
#include "net/yamux_flow.hpp"
#include "net/yamux_frame.hpp"
#include "starling/core/async.hpp"
#include "starling/core/log.hpp"
#include "starling/net/yamux.hpp"

namespace starling::net::yamux {

class Session;

spdlog::logger& log();

class Stream final : public ByteStream, public std::enable_shared_from_this<Stream> {
 public:
  Stream(std::shared_ptr<Session> session, std::uint32_t id, bool outbound);
  ~Stream() override;

  // ByteStream
  awaitable<result<std::size_t>> read_some(MutableBytesView buf) override;
  awaitable<result<void>> write(BytesView data) override;
  awaitable<result<void>> close_write() override;
  void reset() override;
  asio::any_io_executor get_executor() override;
  std::string describe() const override { return describe_; }

  // Called by the session (reader loop, shutdown).
  std::uint32_t id() const noexcept { return id_; }
  bool outbound() const noexcept { return outbound_; }
  RecvWindow& recv() noexcept { return recv_; }
  bool local_fin() const noexcept { return local_fin_; }
  bool remote_fin() const noexcept { return remote_fin_; }
  bool is_reset() const noexcept { return reset_; }
  bool awaiting_ack() const noexcept { return awaiting_ack_; }
  void on_data(const std::uint8_t* p, std::size_t n);
  // The free part of the buffer of a read waiting for data, if nothing is queued before it
  // (else empty): the session may place payload there itself, then call on_direct().
  MutableBytesView direct_target() const noexcept;
  void on_direct(std::size_t n);
  result<void> on_window_update(std::uint32_t delta);
  void on_ack() noexcept;
  void on_remote_fin();
  void on_remote_rst();
  // The session ended: writes fail; reads fail unless the peer already sent FIN.
  void on_session_end(const Error& why);
  // Sends the SYN (outbound) or ACK (inbound) window update.
  void send_open_frame();
  YamuxStreamStats stats() const;

 private:
  friend class Session;
  void fail(const Error& e);
  void maybe_send_window_update();

  std::shared_ptr<Session> session_;
  std::uint32_t id_;
  bool outbound_;
  std::string describe_;
  RecvWindow recv_;
  SendWindow send_;
  ByteQueue buf_;
  MutableBytesView wait_buf_{};  // buffer of the read waiting for data
  std::size_t wait_got_ = 0;     // bytes already copied into it
  AsyncEvent read_ev_;
  AsyncEvent write_ev_;
  bool registered_ = false;    // in the session's stream table
  bool awaiting_ack_ = false;  // outbound, SYN sent, no ACK yet
  bool needs_ack_ = false;     // inbound, ACK not yet sent
  bool local_fin_ = false;
  bool remote_fin_ = false;
  bool reset_ = false;
  std::optional<Error> read_err_;
  std::optional<Error> write_err_;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(ByteStreamPtr conn, bool is_client, YamuxConfig cfg);
  ~Session();

  void start();
  awaitable<result<ByteStreamPtr>> open_stream();
  awaitable<result<ByteStreamPtr>> accept_stream();
  awaitable<result<Duration>> ping(Duration timeout);
  awaitable<void> close();
  // Immediate termination without waiting for streams (used when the handle is dropped).
  void abort(Error why);
  bool closed() const noexcept { return dead_ || local_goaway_; }
  bool dead() const noexcept { return dead_; }
  std::size_t stream_count() const noexcept { return streams_.size(); }
  void set_on_close(std::function<void(const Error&)> cb);
  YamuxStats stats() const;
  const std::string& describe() const noexcept { return describe_; }
  const std::string& conn_describe() const noexcept { return conn_describe_; }

  // Used by streams.
  const YamuxConfig& config() const noexcept { return cfg_; }
  const AutoTune& auto_tune() const noexcept { return tune_; }
  asio::any_io_executor executor() const { return ex_; }
  WindowBudget& budget() noexcept { return budget_; }
  Duration rtt() const noexcept { return srtt_; }
  bool send_buffer_full() const noexcept { return pending_.size() >= cfg_.write_buffer; }
  awaitable<result<void>> wait_send_space();
  void send_data(std::uint32_t id, BytesView payload);
  void send_frame(FrameType type, std::uint16_t flags, std::uint32_t id, std::uint32_t length);
  void note_window(const RecvWindow& w, std::uint64_t growths) noexcept;
  // A stream is done (both FINs or a reset) or destroyed: remove it from the table.
  void unregister(Stream& s);
  // One of our streams got its ACK (or went away before it).
  void unregister_ack() noexcept;

 private:
  static awaitable<void> run_reader(std::shared_ptr<Session> self);
  static awaitable<void> run_writer(std::shared_ptr<Session> self);
  static awaitable<void> run_keepalive(std::shared_ptr<Session> self);
  static awaitable<void> run_finish(std::shared_ptr<Session> self, Duration linger);
  static awaitable<void> run_close(std::shared_ptr<Session> self, Error why);
  awaitable<void> reader_loop();
  awaitable<void> writer_loop();
  awaitable<void> keepalive_loop();
  // Returns once no frame has arrived for `limit` (error: the session ended or cancelled).
  awaitable<result<void>> wait_idle(Duration limit);
  awaitable<void> close_with(Error why);
  awaitable<result<void>> wait_ack_backlog();
  static awaitable<result<void>> wait_io_done(std::shared_ptr<Session> self);

  // Reader: frame dispatch (yamux_reader.cpp).
  result<void> on_header(const FrameHeader& h);
  result<void> on_stream_header(const FrameHeader& h);
  void on_ping(const FrameHeader& h);
  result<void> on_go_away(const FrameHeader& h);
  void on_payload(const std::uint8_t* p, std::size_t n);
  // Payload of the current data frame straight from the connection into the waiting
  // reader's buffer (no copy through rbuf_). Returns bytes placed (0: not possible now).
  result<std::size_t> direct_payload();
  void on_frame_end();
  void apply_end_flags(Stream& s, std::uint16_t flags);
  Stream* find(std::uint32_t id) const;
  Stream* admit_inbound(std::uint32_t id);
  bool is_remote_id(std::uint32_t id) const noexcept { return (id % 2 == 1) != is_client_; }
  bool never_opened(std::uint32_t id) const noexcept;
  void protocol_error(const Error& e);

  void enqueue(const FrameHeader& h, BytesView payload);
  // Ends the session: fails every stream and waiter, optionally queues a GoAway, lets the
  // writer flush, fires on_close, and starts the bounded shutdown of the connection.
  void terminate(Error why, std::optional<YamuxGoAway> goaway, Duration linger);
  void terminate(Error why, std::optional<YamuxGoAway> goaway) {
    terminate(std::move(why), goaway, cfg_.close_timeout);
  }
  void maybe_close_after_goaway();

  struct PendingPing {
    explicit PendingPing(asio::any_io_executor ex) : done(std::move(ex)) {}
    TimePoint sent;
    std::optional<result<Duration>> outcome;
    AsyncEvent done;
  };
  static awaitable<result<Duration>> wait_pong(std::shared_ptr<PendingPing> p);

  ByteStreamPtr conn_;
  asio::any_io_executor ex_;
  bool is_client_;
  YamuxConfig cfg_;
  AutoTune tune_;
  std::string conn_describe_;
  std::string describe_;
  TaskScope scope_;
  WindowBudget budget_;

  std::unordered_map<std::uint32_t, Stream*> streams_;
  std::deque<std::shared_ptr<Stream>> accept_q_;
  AsyncEvent accept_ev_;
  AsyncEvent streams_changed_;
  AsyncEvent ack_ev_;
  std::uint64_t next_local_id_;
  std::uint32_t last_remote_id_ = 0;
  std::size_t unacked_outbound_ = 0;

  // Writer.
  OutBuffer pending_;
  OutBuffer inflight_;
  AsyncEvent writer_wake_;
  AsyncEvent space_;
  AsyncEvent writer_done_;
  bool writer_stopped_ = false;

  // Reader state across reads: the data frame whose payload is being received.
  static constexpr std::size_t kFirstReadBuffer = 4096;
  OutBuffer rbuf_;
  std::uint32_t payload_left_ = 0;
  std::uint32_t payload_stream_ = 0;
  std::uint16_t payload_flags_ = 0;
  AsyncEvent reader_done_;
  TimePoint last_rx_{};

  // Pings.
  std::unordered_map<std::uint32_t, std::shared_ptr<PendingPing>> pings_;
  std::uint32_t next_ping_id_ = 1;
  Duration srtt_{0};

  // Lifecycle.
  bool started_ = false;
  bool local_goaway_ = false;  // we sent GoAway (or are closing)
  bool goaway_sent_ = false;
  bool remote_goaway_ = false;
  bool closing_ = false;  // close() in progress
  bool dead_ = false;
  std::optional<Error> reason_;
  std::function<void(const Error&)> on_close_;
  bool rejection_logged_ = false;

  YamuxStats stats_;
};

}  // namespace starling::net::yamux
