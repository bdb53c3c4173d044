// Fuzzes the RPC wire readers: arbitrary bytes as what a client sends to an RPC server
// (header, request frames; unary, server-streaming and bidi methods), as what a server sends
// to an RPC client (response envelopes, statuses), and into the pure frame decoders. The
// bytes come from an in-memory ByteStream (delivered in small chunks), so nothing blocks;
// a call that does not finish is reported as a hang.
#include <cstdint>
#include <cstdlib>

#include <asio/io_context.hpp>

#include "starling/core/log.hpp"
#include "starling/net/rpc.hpp"
#include "starling/pb/rpc.pb.h"

using namespace starling;
namespace detail = starling::net::detail;
using Msg = starling::pb::RpcStatus;  // any protobuf message type will do

namespace {

class MemoryStream final : public net::ByteStream {
 public:
  MemoryStream(asio::any_io_executor ex, BytesView data, std::size_t chunk)
      : ex_(std::move(ex)), data_(data), chunk_(chunk) {}
  awaitable<result<std::size_t>> read_some(MutableBytesView buf) override {
    if (reset_) co_return make_error(errc::reset, "memory stream reset");
    if (pos_ == data_.size()) co_return make_error(errc::closed, "memory stream end");
    std::size_t n = std::min({buf.size(), chunk_, data_.size() - pos_});
    std::copy_n(data_.begin() + static_cast<std::ptrdiff_t>(pos_), n, buf.begin());
    pos_ += n;
    co_return n;
  }
  awaitable<result<void>> write(BytesView data) override {
    if (reset_) co_return make_error(errc::reset, "memory stream reset");
    written_ += data.size();
    co_return success();
  }
  awaitable<result<void>> close_write() override { co_return success(); }
  void reset() override { reset_ = true; }
  asio::any_io_executor get_executor() override { return ex_; }
  std::string describe() const override { return "memory stream"; }

 private:
  asio::any_io_executor ex_;
  BytesView data_;
  std::size_t chunk_;
  std::size_t pos_ = 0;
  std::size_t written_ = 0;
  bool reset_ = false;
};

std::shared_ptr<detail::MethodEntry> method(detail::MethodKind kind) {
  auto m = std::make_shared<detail::MethodEntry>();
  m->protocol = "/fuzz/1.0.0";
  m->kind = kind;
  m->max_message_size = 4096;
  m->max_duration = 5s;
  m->header_timeout = 5s;
  m->linger = 5s;
  m->max_concurrent_calls = 16;
  switch (kind) {
    case detail::MethodKind::unary: {
      auto h = std::make_shared<net::UnaryHandler<Msg, Msg>>(
          [](const net::RpcContext&, Msg req) -> awaitable<result<Msg>> { co_return req; });
      m->invoke = [h](const net::RpcContext& ctx, detail::ServerCall& call) {
        return detail::run_unary<Msg, Msg>(h, ctx, call);
      };
      break;
    }
    case detail::MethodKind::server_streaming: {
      auto h = std::make_shared<net::ServerStreamingHandler<Msg, Msg>>(
          [](const net::RpcContext&, Msg req, net::RpcWriter<Msg>& out) -> awaitable<result<void>> {
            for (int i = 0; i < 3; ++i) ST_CO_TRY(co_await out.write(req));
            co_return success();
          });
      m->invoke = [h](const net::RpcContext& ctx, detail::ServerCall& call) {
        return detail::run_server_streaming<Msg, Msg>(h, ctx, call);
      };
      break;
    }
    case detail::MethodKind::bidi: {
      auto h = std::make_shared<net::BidiHandler<Msg, Msg>>(
          [](const net::RpcContext&, net::RpcReader<Msg>& in,
             net::RpcWriter<Msg>& out) -> awaitable<result<void>> {
            for (;;) {
              ST_CO_TRY(auto m, co_await in.read());
              if (!m) co_return success();
              if (m->code() == 7) co_return make_error(errc::not_found, m->message());
              ST_CO_TRY(co_await out.write(*m));
            }
          });
      m->invoke = [h](const net::RpcContext& ctx, detail::ServerCall& call) {
        return detail::run_bidi<Msg, Msg>(h, ctx, call);
      };
      break;
    }
  }
  return m;
}

awaitable<void> client_side(net::ByteStreamPtr stream, int mode) {
  auto call = detail::ClientCall::attach(std::move(stream), net::PeerId{}, "/fuzz/1.0.0",
                                         {.timeout = 5s, .max_message_size = 4096});
  Msg req;
  req.set_message("request");
  if (!co_await call->write_message(req)) co_return;
  Msg resp;
  if (mode == 0) {  // unary
    auto got = co_await call->read_message(resp);
    if (got && got.value()) (void)co_await call->finish();
    co_return;
  }
  for (int i = 0; i < 10000; ++i) {  // streaming
    auto got = co_await call->read_message(resp);
    if (!got || !got.value()) break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static bool init = [] {
    set_log_level("off");
    return true;
  }();
  (void)init;
  if (size < 2) return 0;
  int mode = data[0] % 6;
  std::size_t chunk = data[1] % 64 == 0 ? size : data[1] % 64;
  BytesView input(data + 2, size - 2);

  if (mode == 5) {  // pure decoders
    (void)detail::decode_response_frame(input);
    (void)detail::decode_header(input);
    if (input.size() >= 8) {
      std::uint64_t v = 0;
      for (int i = 0; i < 8; ++i) v = v << 8 | input[i];
      (void)detail::payload_size_of_frame(v);
    }
    return 0;
  }

  asio::io_context io;
  auto stream = std::make_shared<MemoryStream>(io.get_executor(), input, chunk);
  bool done = false;
  std::exception_ptr error;
  auto on_done = [&](std::exception_ptr e) {
    done = true;
    error = e;
  };
  if (mode < 3) {
    static const detail::MethodKind kinds[] = {
        detail::MethodKind::unary, detail::MethodKind::server_streaming, detail::MethodKind::bidi};
    asio::co_spawn(
        io,
        detail::serve_stream(method(kinds[mode]), std::make_shared<detail::ServerShared>(), stream,
                             net::PeerId{}),
        on_done);
  } else {
    asio::co_spawn(io, client_side(stream, mode - 3), on_done);
  }
  io.run_for(std::chrono::seconds(20));
  if (error) std::rethrow_exception(error);
  if (!done) __builtin_trap();  // a call that never finishes on a finite input is a hang
  return 0;
}
