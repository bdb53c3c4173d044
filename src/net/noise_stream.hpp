// Private to net/: the encrypted ByteStream produced by a completed Noise handshake. Each
// write is cut into frames (2-byte big-endian length, then ChaChaPoly ciphertext of at most
// 65519 plaintext bytes plus the 16-byte tag), and several frames are batched into one write
// on the underlying stream. Reads decrypt frames straight into the caller's buffer when they
// fit, else in place, keeping the rest of a frame for the next read.
// Threading rule: one executor; one read and one write may be in flight at the same time
// (the read side and the write side share no mutable state besides the reset flag).
// A frame that fails authentication, or a stream that ends inside a frame, resets the stream
// and fails reads with errc::protocol_violation.
#pragma once

#include <optional>

#include "net/noise_handshake.hpp"
#include "starling/net/byte_stream.hpp"

namespace starling::net {

class NoiseStream final : public ByteStream {
 public:
  // Most bytes of framed ciphertext handed to the underlying stream in one write.
  static constexpr std::size_t kWriteBatch = 4 * (2 + noise::kMaxMessage);
  // The read buffer starts at this and doubles after every read that filled it, up to
  // kMaxReadBuffer (bulk transfers); a frame always fits whole. (4 KiB saved 12 KiB per
  // connection but bench-transport's many-caller RPC rate looked lower: kept at 16 KiB.)
  static constexpr std::size_t kMinReadBuffer = 16 * 1024;
  static constexpr std::size_t kMaxReadBuffer = 256 * 1024;

  NoiseStream(ByteStreamPtr raw, noise::TransportCiphers ciphers, std::string description);
  ~NoiseStream() override;

  awaitable<result<std::size_t>> read_some(MutableBytesView buf) override;
  awaitable<result<void>> write(BytesView data) override;
  awaitable<result<void>> close_write() override;
  void reset() override;
  asio::any_io_executor get_executor() override { return raw_->get_executor(); }
  std::string describe() const override { return describe_; }
  // Buffered reads: whole frames already received are decrypted straight into the caller's
  // buffer (yamux hands out its readers' buffers this way).
  bool buffered_reads() const override { return true; }
  awaitable<result<void>> wait_readable() override;
  result<std::size_t> read_buffered(MutableBytesView buf) override;

  std::uint64_t frames_sent() const noexcept { return send_.nonce(); }
  std::uint64_t frames_received() const noexcept { return recv_.nonce(); }

 private:
  // Decrypts whole frames from rbuf_ into `out`; returns bytes produced (0: need more input).
  result<std::size_t> drain(MutableBytesView out);
  awaitable<result<void>> fill();
  Error fail_read(Error e);
  std::optional<Error> read_state() const;  // why reads cannot go on (nullopt: they can)
  bool frame_ready() const noexcept;        // plaintext pending or a whole frame buffered

  ByteStreamPtr raw_;
  std::string describe_;
  bool reset_ = false;

  // Read side.
  noise::CipherState recv_;
  Bytes rbuf_;
  std::size_t rpos_ = 0, rend_ = 0;  // undecrypted input
  std::size_t ppos_ = 0, pend_ = 0;  // decrypted plaintext not yet returned
  std::optional<Error> read_error_;  // sticky: closed or protocol violation

  // Write side.
  noise::CipherState send_;
  Bytes wbuf_;
  bool write_closed_ = false;
  std::optional<Error> write_error_;  // sticky: a failed write may have sent part of a frame
};

}  // namespace starling::net
