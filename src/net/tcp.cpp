#include "starling/net/tcp.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <asio/connect.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "starling/core/log.hpp"

namespace starling::net {

namespace {
std::string ep_str(const asio::ip::tcp::endpoint& ep) {
  auto a = ep.address();
  return (a.is_v6() ? "[" + a.to_string() + "]" : a.to_string()) + ":" + std::to_string(ep.port());
}
}  // namespace

const std::string& tcp_congestion_override() {
  static const std::string name = [] {
    const char* v = std::getenv("STARLING_TCP_CONGESTION");
    return std::string(v && *v && std::strlen(v) < 16 ? v : "");
  }();
  return name;
}

void tune_socket(asio::ip::tcp::socket& s) {
  std::error_code ec;
  s.set_option(asio::ip::tcp::no_delay(true), ec);
  const auto& cc = tcp_congestion_override();
  if (!cc.empty() && ::setsockopt(s.native_handle(), IPPROTO_TCP, TCP_CONGESTION, cc.data(),
                                  static_cast<socklen_t>(cc.size())) != 0) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      logger("net")->warn("STARLING_TCP_CONGESTION={}: setsockopt failed ({}); using the default",
                          cc, std::strerror(errno));
  }
}

TcpStream::TcpStream(asio::ip::tcp::socket socket) : socket_(std::move(socket)) {
  std::error_code ec;
  local_ = socket_.local_endpoint(ec);
  remote_ = socket_.remote_endpoint(ec);
  socket_.non_blocking(true, ec);  // write() tries the socket before waiting
  describe_ = "tcp " + ep_str(local_) + "->" + ep_str(remote_);
}

TcpStream::~TcpStream() {
  std::error_code ec;
  socket_.close(ec);
}

awaitable<result<std::size_t>> TcpStream::read_some(MutableBytesView buf) {
  auto [ec, n] =
      co_await socket_.async_read_some(asio::buffer(buf.data(), buf.size()), use_nothrow);
  if (ec) co_return from_asio(ec, describe_ + " read");
  co_return n;
}

awaitable<result<std::size_t>> TcpStream::write_some_async(BytesView data) {
  auto [ec, n] =
      co_await socket_.async_write_some(asio::buffer(data.data(), data.size()), use_nothrow);
  if (ec) co_return from_asio(ec, describe_ + " write");
  co_return n;
}

awaitable<result<void>> TcpStream::write(BytesView data) {
  // Fast path: the kernel usually takes everything at once; no timer, no suspension.
  while (!data.empty()) {
    std::error_code ec;
    const std::size_t n = socket_.write_some(asio::buffer(data.data(), data.size()), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) break;
    if (ec) co_return from_asio(ec, describe_ + " write");
    data = data.subspan(n);
  }
  // The send buffer is full: wait for the peer to take bytes, each wait bounded.
  while (!data.empty()) {
    // (No co_await inside ?: here: GCC 12 destroys such a temporary twice.)
    result<std::size_t> r = make_error(errc::internal, "write not attempted");
    if (write_timeout_ > Duration::zero()) {
      auto t = co_await with_timeout(write_some_async(data), write_timeout_, describe_ + " write");
      r = std::move(t);
    } else {
      auto t = co_await write_some_async(data);
      r = std::move(t);
    }
    if (!r) {
      if (r.error() == errc::timeout) {
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(write_timeout_).count();
        logger("net")->warn("{}: peer took no bytes for {} ms, closing the connection", describe_,
                            ms);
        reset();
        co_return make_error(errc::timeout,
                             fmt::format("{} write: peer took no bytes for {} ms", describe_, ms));
      }
      co_return r.error();
    }
    data = data.subspan(r.value());
  }
  co_return success();
}

awaitable<result<void>> TcpStream::close_write() {
  std::error_code ec;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ec);
  if (ec && ec != asio::error::not_connected) co_return from_asio(ec, describe_ + " shutdown");
  co_return success();
}

void TcpStream::reset() {
  std::error_code ec;
  if (!socket_.is_open()) return;
  socket_.set_option(asio::socket_base::linger(true, 0), ec);  // RST instead of FIN
  socket_.close(ec);
}

awaitable<result<std::shared_ptr<TcpStream>>> tcp_connect(asio::ip::tcp::endpoint ep,
                                                          Duration timeout) {
  auto ex = co_await asio::this_coro::executor;
  auto op = [](asio::any_io_executor ex,
               asio::ip::tcp::endpoint ep) -> awaitable<result<std::shared_ptr<TcpStream>>> {
    asio::ip::tcp::socket s(ex);
    auto [ec] = co_await s.async_connect(ep, use_nothrow);
    if (ec) co_return from_asio(ec, "connect to " + ep_str(ep));
    tune_socket(s);
    co_return std::make_shared<TcpStream>(std::move(s));
  };
  co_return co_await with_timeout(op(ex, ep), timeout, "connect to " + ep_str(ep));
}

void set_reuse_port(asio::ip::tcp::socket& s, std::error_code& ec) {
  s.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) s.set_option(ReusePort(true), ec);
}

void set_reuse_port(asio::ip::tcp::acceptor& a, std::error_code& ec) {
  a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.set_option(ReusePort(true), ec);
}

awaitable<result<std::shared_ptr<TcpStream>>> tcp_connect_from(asio::ip::tcp::endpoint ep,
                                                               asio::ip::tcp::endpoint local,
                                                               Duration timeout) {
  auto ex = co_await asio::this_coro::executor;
  auto op = [](asio::any_io_executor ex, asio::ip::tcp::endpoint ep,
               asio::ip::tcp::endpoint local) -> awaitable<result<std::shared_ptr<TcpStream>>> {
    asio::ip::tcp::socket s(ex);
    std::error_code ec;
    s.open(ep.protocol(), ec);
    if (!ec) set_reuse_port(s, ec);
    if (!ec) s.bind(local, ec);
    if (ec) co_return from_asio(ec, "bind to " + ep_str(local));
    auto [cec] = co_await s.async_connect(ep, use_nothrow);
    if (cec) co_return from_asio(cec, "connect to " + ep_str(ep) + " from " + ep_str(local));
    tune_socket(s);
    co_return std::make_shared<TcpStream>(std::move(s));
  };
  co_return co_await with_timeout(op(ex, ep, local), timeout, "connect to " + ep_str(ep));
}

}  // namespace starling::net
