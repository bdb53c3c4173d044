// The client side of /starling/moe/1.0.0 without libtorch: one call per coroutine (info,
// forward, backward), and a blocking fan-out that runs many calls in parallel on a host's
// io thread for a training thread, with k_min / timeout_after_k_min semantics.
//
// Threading rule: the coroutines run on the host's executor. run_calls() is for threads other
// than the host's io thread (it blocks the caller).
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "starling/moe/wire.hpp"
#include "starling/net/host.hpp"
#include "starling/net/rpc.hpp"

namespace starling::moe {

struct ExpertCallOptions {
  Duration timeout = 10s;      // the RPC deadline of every call
  averaging::CodecSpec codec;  // codec of the tensors this side sends
  std::string response_codec;  // codec asked of the server ("": its default)
  WireLimits limits;
  std::size_t max_message_size = 64u << 20;  // one-message calls: request and response
  // Streamed calls (stream.hpp): a request whose tensors exceed `stream_threshold` bytes
  // (float32, or encoded if smaller) is sent as a stream of chunks of `stream_chunk_values`
  // values on the -stream method and answered the same way, every frame at most
  // `max_frame_size` bytes; UINT64_MAX: never stream. A server without the stream methods
  // (an older version) gets the request as one message instead, if it fits max_message_size.
  std::uint64_t stream_threshold = 4u << 20;
  std::uint64_t stream_chunk_values = 512u << 10;  // 2 MiB as float32
  std::size_t max_frame_size = 16u << 20;
  // When set, a forward answer must be [rows, answer_row...] (the expert's output schema): a
  // streamed answer's header is checked against it before anything is allocated, so a server
  // cannot make the client allocate more than the output it asked for.
  std::vector<std::int64_t> answer_row;
};

// Who to call.
struct ExpertAddress {
  std::string uid;
  net::PeerId peer;
  std::vector<net::Multiaddr> addrs;  // remembered in the host's address book before dialling
};

// An expert's answer: its one tensor, and the optimizer steps the expert had taken when it
// answered (a forward answer's step goes back with the backward: the staleness bound).
struct ExpertAnswer {
  TensorData tensor;
  std::uint64_t expert_step = 0;
};

awaitable<result<ExpertSchema>> call_info(net::Host& host, ExpertAddress to,
                                          ExpertCallOptions opts);
// forward: [input] -> output. The input must be finite (else errc::invalid_argument locally).
awaitable<result<ExpertAnswer>> call_forward(net::Host& host, ExpertAddress to, TensorData input,
                                             ExpertCallOptions opts);
// backward: [input, grad_output] -> grad_input. `forward_step`: the expert_step of the forward
// answer the gradient comes from (the server checks its staleness bound; absent: unchecked).
awaitable<result<ExpertAnswer>> call_backward(net::Host& host, ExpertAddress to, TensorData input,
                                              TensorData grad_output, ExpertCallOptions opts,
                                              std::optional<std::uint64_t> forward_step = {});

// The streamed form of call_forward (`backward` false: tensors = [input]) and call_backward
// (true: [input, grad_output]), whatever their size; the answer is checked to have the input's
// rows (backward: the input's shape). A server without the stream methods: rpc_errc::
// unimplemented (call_forward / call_backward then fall back to one message).
awaitable<result<ExpertAnswer>> call_streamed(net::Host& host, ExpertAddress to, bool backward,
                                              std::vector<TensorData> tensors,
                                              ExpertCallOptions opts,
                                              std::optional<std::uint64_t> forward_step = {});

// Runs `calls` in parallel on `ex` and blocks until every call ended, or `deadline`, or
// `timeout_after_k_min` after `satisfied(ok)` first returned true (ok[i]: call i succeeded).
// Entry i of the result is the call's outcome, std::nullopt if it was still running (its
// late result is dropped; each call ends by its own RPC deadline). With `elapsed`, entry i is
// set to call i's duration (for a call still running: the time run_calls waited for it).
using CallFn = std::function<awaitable<result<ExpertAnswer>>()>;
std::vector<std::optional<result<ExpertAnswer>>> run_calls(
    asio::any_io_executor ex, std::vector<CallFn> calls, TimePoint deadline,
    const std::function<bool(const std::vector<char>&)>& satisfied = {},
    Duration timeout_after_k_min = Duration::max(), std::vector<Duration>* elapsed = nullptr);

}  // namespace starling::moe
