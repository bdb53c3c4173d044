// TCP as a ByteStream (asio socket), plus connect-with-deadline.
#pragma once

#include <asio/ip/tcp.hpp>

#include "starling/net/byte_stream.hpp"

namespace starling::net {

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

 private:
  asio::ip::tcp::socket socket_;
  asio::ip::tcp::endpoint local_, remote_;
  std::string describe_;
};

// Connects to `ep` within `timeout`. Sets TCP_NODELAY and large socket buffers.
awaitable<result<std::shared_ptr<TcpStream>>> tcp_connect(asio::ip::tcp::endpoint ep,
                                                          Duration timeout);
// Applies Starling's socket options (no-delay, buffer sizes) to a connected socket.
void tune_socket(asio::ip::tcp::socket& s);

}  // namespace starling::net
