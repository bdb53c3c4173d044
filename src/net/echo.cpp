#include "starling/net/echo.hpp"

#include <google/protobuf/wrappers.pb.h>
#include <asio/experimental/awaitable_operators.hpp>

namespace starling::net {

void install_echo(StreamHost& host) {
  host.set_stream_handler(kEchoProtocol, [](ByteStreamPtr s, PeerId) -> awaitable<void> {
    Bytes buf(64 * 1024);
    for (;;) {
      auto n = co_await s->read_some(buf);
      if (!n) break;
      if (!co_await s->write(BytesView(buf).first(n.value()))) co_return;
    }
    (void)co_await s->close_write();
  });
}

namespace {
awaitable<result<void>> send_all(ByteStreamPtr s, BytesView data) {
  constexpr std::size_t kChunk = 256 * 1024;
  for (std::size_t off = 0; off < data.size(); off += kChunk) {
    ST_CO_TRY(co_await s->write(data.subspan(off, std::min(kChunk, data.size() - off))));
  }
  co_return co_await s->close_write();
}
awaitable<result<Bytes>> receive_all(ByteStreamPtr s, std::size_t expect) {
  Bytes out;
  out.reserve(expect);
  Bytes buf(256 * 1024);
  for (;;) {
    auto n = co_await s->read_some(buf);
    if (!n) {
      if (n.error() == errc::closed) break;
      co_return n.error();
    }
    out.insert(out.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n.value()));
    if (out.size() > expect)
      co_return make_error(errc::protocol_violation, "echo returned more bytes than sent");
  }
  co_return out;
}
}  // namespace

awaitable<result<Bytes>> echo(StreamHost& host, const PeerId& peer, BytesView data,
                              Duration timeout) {
  using namespace asio::experimental::awaitable_operators;
  auto op = [&]() -> awaitable<result<Bytes>> {
    ST_CO_TRY(auto s, co_await host.open_stream(peer, kEchoProtocol, timeout));
    auto [sent, got] = co_await (send_all(s, data) && receive_all(s, data.size()));
    if (!sent) {
      s->reset();
      co_return sent.error();
    }
    co_return got;
  };
  co_return co_await with_timeout(op(), timeout, "echo to " + peer.to_string());
}

void install_rpc_echo(RpcServer& server) {
  using google::protobuf::BytesValue;
  server.add_unary<BytesValue, BytesValue>(
      kRpcEchoProtocol,
      [](const RpcContext&, BytesValue req) -> awaitable<result<BytesValue>> { co_return req; });
}

awaitable<result<Bytes>> rpc_echo(RpcClient& client, const PeerId& peer, BytesView data,
                                  Duration timeout) {
  using google::protobuf::BytesValue;
  BytesValue req;
  req.set_value(data.data(), data.size());
  CallOptions opts;
  opts.timeout = timeout;
  ST_CO_TRY(auto resp,
            (co_await client.unary<BytesValue, BytesValue>(peer, kRpcEchoProtocol, req, opts)));
  co_return to_bytes(resp.value());
}

}  // namespace starling::net
