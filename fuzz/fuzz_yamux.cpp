// libFuzzer target: arbitrary bytes as the frames a peer sends to a yamux session, while an
// application accepts, reads, writes, half-closes and resets streams. The session must never
// crash, hang or touch freed memory; whatever it decides about the input is fine.
//
// Input: byte 0 selects the side (bit 0), the read chunking (bits 1-3) and the application's
// behaviour (bits 4-7); the rest is the byte stream from the peer, followed by EOF.
#include <cstddef>
#include <cstdint>
#include <memory>

#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include "net/yamux_frame.hpp"
#include "starling/core/async.hpp"
#include "starling/core/log.hpp"
#include "starling/net/yamux.hpp"

using namespace starling;
using namespace starling::net;

namespace {

// A connection whose peer sends `input` (in chunks, yielding between them) and then EOF.
// Writes are accepted and dropped.
class FuzzConn final : public ByteStream {
 public:
  FuzzConn(asio::any_io_executor ex, BytesView input, std::size_t chunk)
      : ex_(std::move(ex)), input_(input), chunk_(chunk) {}
  awaitable<result<std::size_t>> read_some(MutableBytesView buf) override {
    co_await asio::post(ex_, asio::use_awaitable);  // let the application run in between
    if (dead_) co_return make_error(errc::reset, "fuzz conn reset");
    if (pos_ == input_.size() || buf.empty()) co_return make_error(errc::closed, "fuzz eof");
    const std::size_t n = std::min({buf.size(), chunk_, input_.size() - pos_});
    std::copy_n(input_.data() + pos_, n, buf.data());
    pos_ += n;
    co_return n;
  }
  awaitable<result<void>> write(BytesView data) override {
    co_await asio::post(ex_, asio::use_awaitable);
    if (dead_) co_return make_error(errc::reset, "fuzz conn reset");
    written_ += data.size();
    co_return success();
  }
  awaitable<result<void>> close_write() override { co_return success(); }
  void reset() override { dead_ = true; }
  asio::any_io_executor get_executor() override { return ex_; }
  std::string describe() const override { return "fuzz"; }

 private:
  asio::any_io_executor ex_;
  BytesView input_;
  std::size_t chunk_;
  std::size_t pos_ = 0;
  std::size_t written_ = 0;
  bool dead_ = false;
};

awaitable<void> serve_stream(ByteStreamPtr s, unsigned mode) {
  Bytes buf(mode & 1 ? 7 : 64 * 1024);
  for (int i = 0; i < 64; ++i) {
    auto n = co_await s->read_some(buf);
    if (!n) break;
    if (mode & 2) {
      if (!co_await s->write(BytesView(buf).first(n.value()))) break;
    }
  }
  if (mode & 4) {
    s->reset();
  } else {
    (void)co_await s->close_write();
  }
}

awaitable<void> application(std::shared_ptr<YamuxSession> session, unsigned mode) {
  auto ex = co_await asio::this_coro::executor;
  if (mode & 8) {
    // An outbound stream writing more than the initial window: needs the peer's updates.
    auto out = co_await session->open_stream();
    if (out) {
      asio::co_spawn(
          ex,
          [](ByteStreamPtr s) -> awaitable<void> {
            Bytes big(300 * 1024, 0x5a);
            (void)co_await s->write(big);
            (void)co_await s->close_write();
          }(out.value()),
          asio::detached);
    }
  }
  for (;;) {
    auto s = co_await session->accept_stream();
    if (!s) break;
    asio::co_spawn(ex, serve_stream(std::move(s.value()), mode), asio::detached);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  // The pure header decoder on the raw input as well.
  if (size >= 13) (void)yamux::decode_header(BytesView(data + 1, 12));

  static const bool quiet = [] {
    set_log_level("off");
    return true;
  }();
  (void)quiet;

  const unsigned ctl = data[0];
  static constexpr std::size_t kChunks[] = {5, 11, 12, 13, 100, 1000, 4096, 1 << 20};
  asio::io_context io;
  auto conn = std::make_shared<FuzzConn>(io.get_executor(), BytesView(data + 1, size - 1),
                                         kChunks[(ctl >> 1) & 7]);
  YamuxConfig cfg;
  cfg.max_streams = 8;
  cfg.accept_backlog = 4;
  cfg.max_window = 1 << 20;
  cfg.write_buffer = 64 * 1024;
  cfg.read_buffer = 4096;
  cfg.close_timeout = 50ms;
  auto session = YamuxSession::create(conn, (ctl & 1) != 0, cfg);
  session->start();
  asio::co_spawn(io, application(session, ctl >> 4), asio::detached);
  io.run();  // ends once the input is consumed and the session has shut down
  session.reset();
  return 0;
}
