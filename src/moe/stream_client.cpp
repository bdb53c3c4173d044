// Streamed expert calls: the client side (client.hpp, stream.hpp).
#include <algorithm>

#include <asio/experimental/awaitable_operators.hpp>

#include "moe/stream_call.hpp"
#include "starling/core/log.hpp"
#include "starling/moe/client.hpp"
#include "starling/moe/stream.hpp"
#include "starling/pb/moe.pb.h"

namespace starling::moe {

namespace {

using Frame = pb::MoeStreamFrame;

// The answer must be one tensor with the request's rows (backward: the input's shape; forward:
// [rows, answer_row...] when the caller knows the expert's output schema).
result<void> check_answer(const StreamHeader& h, const TensorData& input, bool backward,
                          const std::vector<std::int64_t>& answer_row) {
  if (h.shapes.size() != 1)
    return Error(errc::protocol_violation,
                 "answered " + std::to_string(h.shapes.size()) + " tensors, want 1");
  const auto& s = h.shapes[0];
  const bool row_ok =
      answer_row.empty() || (s.size() == answer_row.size() + 1 &&
                             std::equal(answer_row.begin(), answer_row.end(), s.begin() + 1));
  if (backward ? s != input.shape : (s.empty() || s[0] != input.shape[0] || !row_ok))
    return Error(errc::protocol_violation, "answered a tensor " + describe_shape(s) +
                                               " for an input " + describe_shape(input.shape));
  return success();
}

}  // namespace

namespace detail {

awaitable<result<ExpertAnswer>> stream_call(net::Host& host, const ExpertAddress& to, bool backward,
                                            const std::vector<TensorData>& tensors,
                                            const ExpertCallOptions& opts,
                                            std::optional<std::uint64_t> forward_step) {
  if (tensors.size() != (backward ? 2u : 1u) || tensors[0].shape.empty())
    co_return Error(errc::invalid_argument, "expert " + to.uid + ": bad streamed call");
  if (!to.addrs.empty()) host.add_addresses(to.peer, to.addrs);
  const std::string who = "expert " + to.uid + " (streamed)";
  pb::MoeStreamHeader header;
  header.set_uid(to.uid);
  header.set_response_codec(opts.response_codec);
  if (forward_step) header.set_forward_step(*forward_step);
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<std::span<const float>> spans;
  for (const auto& t : tensors) {
    shapes.push_back(t.shape);
    spans.emplace_back(t.values);
  }
  StreamSlicer slicer(header, std::move(shapes), std::move(spans), opts.codec,
                      opts.stream_chunk_values);

  net::CallOptions copts;
  copts.timeout = opts.timeout;  // the whole call: open, every frame both ways
  copts.max_message_size = opts.max_frame_size;
  net::RpcClient client(host);
  auto call = co_await client.bidi<Frame, Frame>(
      to.peer, backward ? kBackwardStreamProtocol : kForwardStreamProtocol, copts);
  if (!call) co_return call.error().with_context(who);
  auto& c = call.value();

  // The request is written while the answer is read, so a server that refuses the stream
  // early (its header: shape, budget) ends the call at once, not after the whole upload. The
  // reader decides the outcome (the server's status, the answer, or the call's deadline): the
  // writer, done, waits until the reader ends and cancels it (a write blocked on flow control
  // is not woken by the stream's reset, only by cancellation). A request that cannot be
  // encoded ends the call from the writer's side; a failed write ends the reader (the
  // server's status, if it came, wins over the write's error).
  std::optional<Error> slicer_error, write_error;
  auto write_all = [&]() -> awaitable<void> {
    for (;;) {
      auto f = slicer.next();
      if (!f) {
        slicer_error = f.error();
        co_return;
      }
      if (!f.value()) break;
      if (auto w = co_await c.write(*f.value()); !w) {
        write_error = w.error();
        c.cancel();  // the reader ends now (a write refused locally leaves the stream open)
        break;
      }
    }
    if (!write_error) (void)co_await c.close_write();
    (void)co_await sleep_for(net::detail::kMaxTimeout);  // until the reader ends
  };
  StreamAssembler answer(opts.limits, [&](const StreamHeader& h) {
    return check_answer(h, tensors[0], backward, opts.answer_row);
  });
  std::optional<Error> read_error;
  bool bad_answer = false;
  auto read_all = [&]() -> awaitable<void> {
    for (;;) {
      auto f = co_await c.read();
      if (!f) {
        read_error = f.error();
        break;
      }
      auto r = f.value() ? answer.feed(*f.value()) : answer.finish();
      if (!r) {
        read_error = r.error();
        bad_answer = true;
        break;
      }
      if (!f.value()) co_return;
    }
  };
  {
    using namespace asio::experimental::awaitable_operators;
    co_await (write_all() || read_all());
  }
  if (!read_error && !answer.complete()) read_error = Error(errc::closed, "request not sent");
  c.cancel();
  if (slicer_error) co_return slicer_error->with_context(who);
  if (bad_answer) {
    logger("moe")->info("{} answered a bad stream: {}", who, read_error->message());
    co_return read_error->with_context(who + " answered");
  }
  if (write_error && !(read_error && net::is_remote_error(*read_error)))
    co_return write_error->with_context(who);
  if (read_error) co_return read_error->with_context(who);
  const auto step = answer.header().expert_step;
  auto out = answer.take();
  co_return ExpertAnswer{std::move(out.front()), step};
}

}  // namespace detail

awaitable<result<ExpertAnswer>> call_streamed(net::Host& host, ExpertAddress to, bool backward,
                                              std::vector<TensorData> tensors,
                                              ExpertCallOptions opts,
                                              std::optional<std::uint64_t> forward_step) {
  co_return co_await detail::stream_call(host, to, backward, tensors, opts, forward_step);
}

}  // namespace starling::moe
