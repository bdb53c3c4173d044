// Blocking RPC for callers outside the io thread (training loops, CLI tools): each call runs
// the coroutine RpcClient on the host's executor through block_on() and waits for it.
//
// Threading rule: call from any thread EXCEPT the host's io thread (there the calls refuse
// with errc::internal instead of deadlocking). The host must be running on its executor
// (e.g. an IoThread). The CallOptions timeout bounds each call as in RpcClient.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "starling/core/blocking.hpp"
#include "starling/net/rpc.hpp"

namespace starling::net {

class BlockingRpcClient {
 public:
  // `host` must outlive this client and every call made through it.
  explicit BlockingRpcClient(StreamHost& host) : host_(&host) {}

  // Extra time block_on allows beyond CallOptions::timeout before it cancels the call itself
  // (the call normally ends by its own deadline first).
  Duration grace = 1s;

  template <class Req, class Resp>
  result<Resp> unary(PeerId peer, std::string protocol, Req req, CallOptions opts = {}) {
    // The operation owns copies of everything it uses (the lambda lives in block_on's
    // coroutine frame), so nothing points into this thread's stack.
    return block_on(
        host_->get_executor(),
        [host = host_, peer = std::move(peer), protocol = std::move(protocol), req = std::move(req),
         opts]() -> awaitable<result<Resp>> {
          RpcClient client(*host);
          co_return co_await client.unary<Req, Resp>(peer, protocol, req, opts);
        },
        std::min(opts.timeout, detail::kMaxTimeout) + grace);
  }

  // Server-streaming; collects every response (the call's timeout bounds the whole stream).
  template <class Req, class Resp>
  result<std::vector<Resp>> server_streaming(PeerId peer, std::string protocol, Req req,
                                             CallOptions opts = {}) {
    return block_on(
        host_->get_executor(),
        [host = host_, peer = std::move(peer), protocol = std::move(protocol), req = std::move(req),
         opts]() -> awaitable<result<std::vector<Resp>>> {
          RpcClient client(*host);
          std::vector<Resp> out;
          auto r = co_await client.server_streaming_each<Req, Resp>(
              peer, protocol, req,
              [&out](Resp&& m) -> result<void> {
                out.push_back(std::move(m));
                return success();
              },
              opts);
          if (!r) co_return r.error();
          co_return out;
        },
        std::min(opts.timeout, detail::kMaxTimeout) + grace);
  }

 private:
  StreamHost* host_;
};

}  // namespace starling::net
