// TCP as a ByteStream (asio socket), plus connect-with-deadline.
#pragma once

#include <asio/ip/tcp.hpp>

#include "starling/net/byte_stream.hpp"

namespace starling::net {

// Writes try the (non-blocking) socket directly first and wait only when the kernel's send
// buffer is full. A write that makes no progress for write_timeout() (a peer that stopped
// reading) fails with errc::timeout and resets the connection, with a logged reason.
inline constexpr Duration kDefaultWriteTimeout = 30s;

class TcpStream final : public ByteStream {
 public:
  explicit TcpStream(asio::ip::tcp::socket socket);
  ~TcpStream() override;
  awaitable<result<std::size_t>> read_some(MutableBytesView buf) override;
  awaitable<result<void>> write(BytesView data) override;
  awaitable<result<void>> close_write() override;
  void reset() override;
  asio::any_io_executor get_executor() override { return socket_.get_executor(); }
  std::string describe() const override { return describe_; }

  asio::ip::tcp::endpoint local_endpoint() const { return local_; }
  asio::ip::tcp::endpoint remote_endpoint() const { return remote_; }
  // How long a write may wait without the peer taking any byte (0: forever).
  void set_write_timeout(Duration d) { write_timeout_ = d; }
  Duration write_timeout() const { return write_timeout_; }

 private:
  awaitable<result<std::size_t>> write_some_async(BytesView data);
  asio::ip::tcp::socket socket_;
  Duration write_timeout_ = kDefaultWriteTimeout;
  asio::ip::tcp::endpoint local_, remote_;
  std::string describe_;
};

// A token bucket shared by every connection of a host, per direction: `rate` bytes per
// second on average, bursts up to `burst` bytes. Callers take what they send or receive and
// wait for the debt to be paid back (so concurrent connections share the rate).
//
// Threading rule: one executor (the host's); reserve() itself is pure arithmetic.
class TokenBucket {
 public:
  // burst 0 = max(16 KiB, rate / 10): 100 ms worth of the rate.
  TokenBucket(std::uint64_t rate, std::uint64_t burst = 0, TimePoint now = Clock::now());
  // Takes `n` bytes at time `now` (the balance may go negative); returns how long the caller
  // must wait before using them (zero while the bucket covers them).
  Duration reserve(std::size_t n, TimePoint now);
  // reserve() and wait; errc::cancelled if cancelled while waiting.
  awaitable<result<void>> take(std::size_t n);
  std::uint64_t rate() const noexcept { return rate_; }
  std::uint64_t burst() const noexcept { return burst_; }

 private:
  std::uint64_t rate_, burst_;
  double tokens_;
  TimePoint last_;
};

// Wraps a connection's byte stream so that its writes take from `up` and its reads from
// `down` (either may be null: unlimited). Reads return at most one burst at a time and wait
// for their bytes' tokens before returning, so a peer is slowed by TCP flow control.
ByteStreamPtr rate_limited(ByteStreamPtr inner, std::shared_ptr<TokenBucket> up,
                           std::shared_ptr<TokenBucket> down);

// Connects to `ep` within `timeout`. Sets TCP_NODELAY and large socket buffers.
awaitable<result<std::shared_ptr<TcpStream>>> tcp_connect(asio::ip::tcp::endpoint ep,
                                                          Duration timeout);
// SO_REUSEPORT, for the options below.
using ReusePort = asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>;
// SO_REUSEADDR + SO_REUSEPORT: set on every listener and on hole-punch dial sockets, so that
// a dial can leave from the listening port (the mapping a NAT and the relay observed).
void set_reuse_port(asio::ip::tcp::socket& s, std::error_code& ec);
void set_reuse_port(asio::ip::tcp::acceptor& a, std::error_code& ec);
// As tcp_connect, from the local endpoint `local` (typically a listening port; DCUtR). Two
// such dials towards each other at the same time make one TCP simultaneous-open connection.
awaitable<result<std::shared_ptr<TcpStream>>> tcp_connect_from(asio::ip::tcp::endpoint ep,
                                                               asio::ip::tcp::endpoint local,
                                                               Duration timeout);
// Applies Starling's socket options (no-delay, buffer sizes) to a connected socket, and the
// congestion control named by the environment variable STARLING_TCP_CONGESTION (e.g. "cubic",
// "bbr"; unset: the kernel's default), per socket. Setting one that is not in
// net.ipv4.tcp_allowed_congestion_control needs CAP_NET_ADMIN; a failure is logged once and
// the default stays.
void tune_socket(asio::ip::tcp::socket& s);
// The congestion control tune_socket() sets ("" = the kernel's default).
const std::string& tcp_congestion_override();

}  // namespace starling::net
