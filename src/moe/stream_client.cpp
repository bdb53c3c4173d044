// Streamed expert calls: the client side (client.hpp, stream.hpp).
#include "moe/stream_call.hpp"
#include "starling/core/log.hpp"
#include "starling/moe/client.hpp"
#include "starling/moe/stream.hpp"
#include "starling/pb/moe.pb.h"

namespace starling::moe {

namespace {

using Frame = pb::MoeStreamFrame;

// The answer must be one tensor with the request's rows (backward: the input's shape).
result<void> check_answer(const StreamHeader& h, const TensorData& input, bool backward) {
  if (h.shapes.size() != 1)
    return Error(errc::protocol_violation,
                 "answered " + std::to_string(h.shapes.size()) + " tensors, want 1");
  const auto& s = h.shapes[0];
  if (backward ? s != input.shape : (s.empty() || s[0] != input.shape[0]))
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
  for (;;) {
    auto f = slicer.next();
    if (!f) {
      call.value().cancel();
      co_return f.error().with_context(who);
    }
    if (!f.value()) break;
    auto w = co_await call.value().write(*f.value());
    if (!w) co_return w.error().with_context(who);
  }
  ST_CO_TRY(co_await call.value().close_write());

  StreamAssembler answer(
      opts.limits, [&](const StreamHeader& h) { return check_answer(h, tensors[0], backward); });
  for (;;) {
    auto f = co_await call.value().read();
    if (!f) co_return f.error().with_context(who);
    if (!f.value()) break;
    auto r = answer.feed(*f.value());
    if (!r) {
      call.value().cancel();
      logger("moe")->info("{} answered a bad stream: {}", who, r.error().message());
      co_return r.error().with_context(who + " answered");
    }
  }
  auto fin = answer.finish();
  if (!fin) {
    logger("moe")->info("{} answered a bad stream: {}", who, fin.error().message());
    co_return fin.error().with_context(who + " answered");
  }
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
