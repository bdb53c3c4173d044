// ByteStream: the one seam every layer of the transport stacks on. A raw TCP socket, a
// Noise-encrypted channel and a yamux stream are all ByteStreams, so multistream-select,
// length-prefixed messages and RPC work over any of them.
//
// Threading rule: a ByteStream belongs to one executor; call it only from coroutines on it.
// At most one read and one write may be outstanding at a time (like a socket).
// Cancellation: every awaiting operation honours asio per-operation cancellation (so
// with_timeout() and TaskScope::close() can stop it).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include <asio/any_io_executor.hpp>

#include "starling/core/async.hpp"
#include "starling/core/bytes.hpp"

namespace starling::net {

class ByteStream {
 public:
  virtual ~ByteStream() = default;

  // Reads between 1 and buf.size() bytes. errc::closed when the peer closed its write side
  // and all data was consumed; errc::reset when the stream was reset.
  virtual awaitable<result<std::size_t>> read_some(MutableBytesView buf) = 0;
  // Writes all of `data` (may wait for flow-control credit).
  virtual awaitable<result<void>> write(BytesView data) = 0;
  // Half-close: no more writes; reads continue until the peer closes.
  virtual awaitable<result<void>> close_write() = 0;
  // Aborts both directions at once; pending operations fail with errc::reset. Idempotent.
  virtual void reset() = 0;
  virtual asio::any_io_executor get_executor() = 0;
  // A short description for logs ("yamux stream 5 to 12D3KooW...").
  virtual std::string describe() const = 0;

  // Optional, for a multiplexer that wants to place bytes straight into its readers' buffers
  // (yamux over Noise: decrypt into the application's buffer, no copy). When
  // buffered_reads() is true: wait_readable() waits until read_buffered() has bytes (or an
  // error) without handing any out, and read_buffered() returns at once what it has (0: none).
  // Nothing is written into a caller's buffer while it is suspended. read_some() stays valid
  // and mixes freely with these.
  virtual bool buffered_reads() const { return false; }
  virtual awaitable<result<void>> wait_readable();
  virtual result<std::size_t> read_buffered(MutableBytesView buf);
};

using ByteStreamPtr = std::shared_ptr<ByteStream>;

// Reads exactly buf.size() bytes (errc::closed if the stream ends first).
awaitable<result<void>> read_exact(ByteStream& s, MutableBytesView buf);

// Buffered reader over a ByteStream for parsers that need lookahead (varints, lines).
// Bytes read past what the caller consumed are kept and returned by later reads;
// take_buffered() hands them to whoever takes over the stream next.
class BufferedReader {
 public:
  explicit BufferedReader(ByteStream& s) : s_(&s) {}
  awaitable<result<std::uint64_t>> read_uvarint();
  awaitable<result<void>> read_exact(MutableBytesView out);
  // Reads exactly n bytes into a new buffer that grows as the bytes arrive (a peer that
  // announces a large frame and sends nothing holds no memory for it).
  awaitable<result<Bytes>> read_bytes(std::size_t n);
  // Reads a uvarint length prefix then that many bytes; errc::too_large above max_len.
  awaitable<result<Bytes>> read_length_prefixed(std::size_t max_len);
  Bytes take_buffered();
  std::size_t buffered() const noexcept { return buf_.size() - pos_; }

 private:
  awaitable<result<void>> fill();
  ByteStream* s_;
  Bytes buf_;
  std::size_t pos_ = 0;
};

// Writes a uvarint length prefix followed by `payload`, in one write.
awaitable<result<void>> write_length_prefixed(ByteStream& s, BytesView payload);
Bytes length_prefixed(BytesView payload);

// Wraps a stream so that bytes already read from it (e.g. during negotiation) are returned
// first. Used when a BufferedReader over-read and another layer takes over the stream.
ByteStreamPtr with_prefix(ByteStreamPtr inner, Bytes already_read);

}  // namespace starling::net
