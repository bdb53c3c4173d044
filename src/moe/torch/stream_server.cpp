// ExpertServer's streamed methods (/starling/moe/1.0.0/forward-stream, backward-stream;
// expert_server.hpp, stream.hpp): the request's frames are checked and decoded into place as
// they come, the whole request goes to the runtime like a one-message one, and the answer is
// encoded and sent one chunk at a time.
#include "moe/torch/server_impl.hpp"
#include "starling/core/log.hpp"
#include "starling/moe/stream.hpp"

namespace starling::moe {

namespace {

using Frame = pb::MoeStreamFrame;

std::uint64_t values_per_row(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

// A request stream's tensors must be [rows, input...] (and [rows, output...] for backward)
// with 1 <= rows <= max_batch.
result<void> check_request(const Backend& b, bool backward, const StreamHeader& h,
                           std::size_t max_batch) {
  const auto& s = b.schema;
  auto bad = [&](const std::string& why) {
    return Error(errc::invalid_argument, "expert " + s.uid + ": " + why);
  };
  if (h.shapes.size() != (backward ? 2u : 1u))
    return bad(std::string(backward ? "backward" : "forward") + " takes " +
               (backward ? "2 tensors" : "1 tensor") + ", got " + std::to_string(h.shapes.size()));
  for (std::size_t i = 0; i < h.shapes.size(); ++i) {
    const auto& want = i == 0 ? s.input_shape : s.output_shape;
    const auto& got = h.shapes[i];
    bool ok = got.size() == want.size() + 1 && got[0] >= 1 && got[0] == h.shapes[0][0];
    for (std::size_t k = 0; ok && k < want.size(); ++k) ok = got[k + 1] == want[k];
    if (!ok)
      return bad(std::string(i == 0 ? "input" : "grad_output") + " has shape " +
                 describe_shape(got) + ", the expert takes [N, " + describe_shape(want).substr(1));
  }
  if (static_cast<std::uint64_t>(h.shapes[0][0]) > max_batch)
    return bad(std::to_string(h.shapes[0][0]) + " rows exceed max_batch " +
               std::to_string(max_batch));
  return success();
}

// The bytes a streamed call holds (ExpertServer::Impl::stream_bytes) until it ends.
struct Reservation {
  std::shared_ptr<ExpertServer::Impl> im;
  std::uint64_t bytes = 0;
  ~Reservation() { im->stream_bytes -= bytes; }
};

awaitable<result<void>> serve_stream(std::shared_ptr<ExpertServer::Impl> self, bool backward,
                                     const net::RpcContext& ctx, net::RpcReader<Frame>& in,
                                     net::RpcWriter<Frame>& out) {
  auto& im = *self;
  Reservation held{self};
  bool over_budget = false;
  StreamAssembler request(im.cfg.limits, [&](const StreamHeader& h) -> result<void> {
    auto it = im.by_uid.find(h.uid);
    if (it == im.by_uid.end())
      return Error(errc::not_found, "unknown expert uid '" + h.uid.substr(0, 64) + "'");
    const Backend& b = *it->second;
    const std::size_t max_batch =
        std::min(im.cfg.forward_pool.max_batch, im.cfg.backward_pool.max_batch);
    ST_TRY(check_request(b, backward, h, max_batch));
    const auto rows = static_cast<std::uint64_t>(h.shapes[0][0]);
    // The request and the answer (forward: the output rows; backward: the input gradient).
    const auto& answer_row = backward ? b.schema.input_shape : b.schema.output_shape;
    const std::uint64_t bytes =
        (h.total_values() + rows * values_per_row(answer_row)) * sizeof(float);
    if (bytes > im.cfg.max_stream_bytes || im.stream_bytes > im.cfg.max_stream_bytes - bytes) {
      over_budget = true;
      return Error(errc::too_large, "streamed calls in flight hold " +
                                        std::to_string(im.stream_bytes) + " bytes; " +
                                        std::to_string(bytes) + " more exceed max_stream_bytes " +
                                        std::to_string(im.cfg.max_stream_bytes));
    }
    im.stream_bytes += bytes;
    held.bytes = bytes;
    return success();
  });
  auto refuse = [&](const Error& e) {
    if (over_budget)
      ++im.stats->refused;
    else
      ++im.stats->bad_requests;
    logger("moe")->debug("stream from {} refused: {}", ctx.remote().short_string(), e.message());
    return e;
  };
  for (;;) {
    auto f = co_await in.read();
    if (!f) {
      const auto& e = f.error();
      if (e == errc::too_large || e == errc::invalid_argument || e == errc::protocol_violation)
        co_return refuse(e);
      co_return e;  // the client went away, the deadline: nothing to log
    }
    if (!f.value()) break;
    auto r = request.feed(*f.value());
    if (!r) co_return refuse(r.error());
  }
  if (auto fin = request.finish(); !fin) co_return refuse(fin.error());
  ++im.stats->streamed_calls;

  const StreamHeader h = request.header();
  Task t;
  t.rows = static_cast<std::size_t>(h.shapes[0][0]);
  t.streamed = true;
  DecodedRequest d;
  d.uid = h.uid;
  d.tensors = request.take();
  d.response_codec = h.response_codec;
  d.codec_given = h.codec_given;
  d.forward_step = h.forward_step;
  t.decoded = std::move(d);
  auto r = co_await im.submit(backward, ctx, h.uid, std::move(t));
  if (!r) {
    if (r.error() != errc::timeout && r.error() != errc::cancelled)
      logger("moe")->debug("stream from {}: {}", ctx.remote().short_string(), r.error().message());
    co_return r.error();
  }
  auto* a = std::get_if<StreamedAnswer>(&r.value());
  if (!a) co_return Error(errc::internal, "one-message answer to a streamed request");
  pb::MoeStreamHeader rh;
  rh.set_expert_step(a->expert_step);
  const std::span<const float> values(a->rows.data_ptr<float>(),
                                      static_cast<std::size_t>(a->rows.numel()));
  StreamSlicer slicer(rh, {a->shape}, {values}, a->codec, im.cfg.stream_chunk_values);
  for (;;) {
    auto f = slicer.next();
    if (!f) co_return f.error().with_context("expert " + h.uid + " output");
    if (!f.value()) break;
    ST_CO_TRY(co_await out.write(*f.value()));
  }
  co_return success();
}

}  // namespace

void ExpertServer::Impl::register_stream_methods(std::weak_ptr<Impl> weak) {
  net::MethodOptions mo;
  mo.max_message_size = cfg.max_frame_size;
  mo.max_duration = cfg.max_stream_duration;
  for (bool backward : {false, true}) {
    rpc->add_bidi<Frame, Frame>(
        backward ? kBackwardStreamProtocol : kForwardStreamProtocol,
        [weak, backward](const net::RpcContext& ctx, net::RpcReader<Frame>& in,
                         net::RpcWriter<Frame>& out) -> awaitable<result<void>> {
          auto self = weak.lock();
          if (!self) co_return Error(errc::unavailable, "expert server stopped");
          co_return co_await serve_stream(std::move(self), backward, ctx, in, out);
        },
        mo);
  }
}

}  // namespace starling::moe
