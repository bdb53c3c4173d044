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
  explicit BlockingRpcClient(StreamHost& host) : host_(&host), client_(host) {}

  // Extra time block_on allows beyond CallOptions::timeout before it cancels the call itself
  // (the call normally ends by its own deadline first).
  Duration grace = 1s;

  template <class Req, class Resp>
  result<Resp> unary(PeerId peer, std::string protocol, Req req, CallOptions opts = {}) {
    RpcClient* client = &client_;
    return block_on(
        host_->get_executor(),
        [client, peer = std::move(peer), protocol = std::move(protocol), req = std::move(req),
         opts] { return client->unary<Req, Resp>(peer, protocol, req, opts); },
        opts.timeout + grace);
  }

  // Server-streaming; collects every response (the call's timeout bounds the whole stream).
  template <class Req, class Resp>
  result<std::vector<Resp>> server_streaming(PeerId peer, std::string protocol, Req req,
                                             CallOptions opts = {}) {
    RpcClient* client = &client_;
    return block_on(
        host_->get_executor(),
        [client, peer = std::move(peer), protocol = std::move(protocol), req = std::move(req),
         opts] { return collect<Req, Resp>(client, peer, protocol, req, opts); },
        opts.timeout + grace);
  }

 private:
  template <class Req, class Resp>
  static awaitable<result<std::vector<Resp>>> collect(RpcClient* client, PeerId peer,
                                                      std::string protocol, Req req,
                                                      CallOptions opts) {
    std::vector<Resp> out;
    auto r = co_await client->server_streaming_each<Req, Resp>(
        std::move(peer), std::move(protocol), std::move(req),
        [&out](Resp&& r) -> result<void> {
          out.push_back(std::move(r));
          return success();
        },
        opts);
    if (!r) co_return r.error();
    co_return out;
  }

  StreamHost* host_;
  RpcClient client_;
};

}  // namespace starling::net
