// Streamed expert calls (stream.hpp) over loopback: a tensor larger than the one-message limit
// through forward and backward, small thresholds against one-message answers, a server
// without the stream methods, bad streams refused by the server (which keeps serving) and by
// the client, the memory budget and the deadline.
#include <gtest/gtest.h>

#include "moe/moe_env.hpp"
#include "moe/stream_frames.hpp"
#include "starling/moe/stream.hpp"
#include "starling/pb/moe.pb.h"

namespace starling::moe {
namespace {

using namespace test;

// An elementwise expert on [N, 4096, 16] rows (65,536 values a row, cheap to compute): 260
// rows are 17,039,360 values, more than one message may carry (WireLimits::max_elements,
// 16 Mi values, 64 MiB).
struct Wide : torch::nn::Module {
  torch::Tensor w, b;
  Wide() {
    w = register_parameter("w", torch::linspace(0.5, 1.5, 16));
    b = register_parameter("b", torch::linspace(-0.1, 0.1, 16));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(x * w) + b; }
};

ExpertModule wide_expert() {
  auto m = std::make_shared<Wide>();
  ExpertModule e;
  e.forward = [m](const torch::Tensor& x) { return m->forward(x); };
  e.parameters = m;
  e.input_shape = {4096, 16};
  e.output_shape = {4096, 16};
  e.type = "wide";
  return e;
}

std::shared_ptr<ExpertServer> serve_one(Env& env, ExpertModule m, const ExpertServerConfig& c) {
  return env.serve_module(1, "ffn.0", std::move(m), c, false);
}

// Destroys a test's RPC server on the io thread (its owner).
void drop_on_io(Env& env, std::shared_ptr<net::RpcServer>& rpc) {
  (void)block_on(
      env.io.executor(),
      [&]() -> awaitable<result<void>> {
        rpc.reset();
        co_return success();
      },
      10s);
}

// call_forward from node 2 to expert "ffn.0" on node 1.
result<ExpertAnswer> forward_to_node1(Env& env, const TensorData& x, const ExpertCallOptions& o) {
  return block_on(
      env.io.executor(),
      [&] { return call_forward(*env.cluster->host_ptr(2), env.address(1, "ffn.0"), x, o); }, 20s);
}

TEST(MoeStream, TensorOverOneMessageLimitThroughForwardAndBackward) {
  Env env;
  auto server = serve_one(env, wide_expert(), server_config());
  auto local = wide_expert();
  torch::manual_seed(5);
  const std::int64_t rows = 260;
  ASSERT_GT(rows * 4096 * 16, std::int64_t{16} << 20);
  auto x = torch::randn({rows, 4096, 16});
  auto g = torch::randn({rows, 4096, 16});

  // Streaming disabled: the same call does not fit one message.
  ExpertCallOptions off;
  off.timeout = 60s;
  off.stream_threshold = std::numeric_limits<std::uint64_t>::max();
  RemoteExpert unstreamed(env.cluster->host_ptr(2), env.address(1, "ffn.0"), off);
  EXPECT_THROW(unstreamed.forward(x), std::runtime_error);
  EXPECT_EQ(server->stats().streamed_calls.load(), 0u);

  ExpertCallOptions on;
  on.timeout = 60s;
  RemoteExpert remote(env.cluster->host_ptr(2), env.address(1, "ffn.0"), on);
  expect_remote_matches_local(remote, local, x, g);
  EXPECT_EQ(server->stats().streamed_calls.load(), 2u);  // forward and backward
  torch::optim::SGD opt(local.parameters->parameters(), torch::optim::SGDOptions(kLr));
  opt.step();
  expect_params_close(*server->module_of("ffn.0"), *local.parameters, "after the streamed step");
  env.stop(server);
}

TEST(MoeStream, SmallThresholdAnswersAsOneMessageDoes) {
  Env env;
  auto server = serve_one(env, make_ffn_expert(kDim, kHidden, 7), server_config());
  torch::manual_seed(9);
  TensorData x = ramp({64, kDim});
  for (const char* codec : {"", "float16"}) {
    ExpertCallOptions one, streamed;
    one.response_codec = streamed.response_codec = codec;
    streamed.stream_threshold = 1024;  // 64 x 8 floats = 2 KiB: streamed
    streamed.stream_chunk_values = 100;
    auto a = forward_to_node1(env, x, one);
    auto b = forward_to_node1(env, x, streamed);
    ASSERT_TRUE(a) << a.error().message();
    ASSERT_TRUE(b) << b.error().message();
    EXPECT_EQ(a.value().tensor.shape, b.value().tensor.shape);
    EXPECT_EQ(a.value().tensor.values, b.value().tensor.values) << codec;
  }
  EXPECT_EQ(server->stats().streamed_calls.load(), 2u);
  env.stop(server);
}

TEST(MoeStream, ServerWithoutStreamMethodsGetsOneMessage) {
  Env env;
  // An "older" server: the one-message forward method only (an identity expert).
  auto rpc = std::make_shared<net::RpcServer>(*env.cluster->host_ptr(1));
  std::atomic<int> served{0};
  rpc->add_unary<pb::ExpertRequest, pb::ExpertResponse>(
      kForwardProtocol,
      [&](const net::RpcContext&, pb::ExpertRequest req) -> awaitable<result<pb::ExpertResponse>> {
        ++served;
        pb::ExpertResponse resp;
        *resp.add_tensors() = req.tensors(0);
        co_return resp;
      });
  ExpertCallOptions o;
  o.stream_threshold = 64;
  TensorData x = ramp({16, kDim});
  auto r = forward_to_node1(env, x, o);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value().tensor.values, x.values);
  EXPECT_EQ(served.load(), 1);
  // A request over the one-message limit cannot fall back: the stream's error is returned.
  o.max_message_size = 256;
  auto too_big = forward_to_node1(env, x, o);
  ASSERT_FALSE(too_big);
  EXPECT_EQ(net::generic_errc(too_big.error()), errc::unsupported) << too_big.error().message();
  drop_on_io(env, rpc);
}

TEST(MoeStream, MixtureStreamsItsCallsAndGetsTheSameOutputs) {
  Env env;
  auto server = env.serve(1, "ffn.0.[0:2]");
  auto x = torch::randn({6, kDim});
  auto run = [&](std::uint64_t threshold) {
    auto o = mixture_options({1, 2}, 2, 2, 10s, 5s);
    o.stream_threshold = threshold;
    torch::manual_seed(21);  // the same gating in both
    RemoteMixtureOfExperts moe(o, env.cluster->host_ptr(2), env.directory(2));
    torch::NoGradGuard ng;
    return moe->forward(x);
  };
  auto one = run(std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(server->stats().streamed_calls.load(), 0u);
  auto streamed = run(64);  // each expert gets the 6 rows: 192 bytes a call, streamed
  EXPECT_EQ(server->stats().streamed_calls.load(), 2u);
  EXPECT_TRUE(torch::allclose(one, streamed, 1e-6, 1e-6));
  env.stop(server);
}

// Sends `frames` on a forward-stream call (then half-closes) and returns the call's outcome.
result<void> send_frames(Env& env, const std::vector<Frame>& frames, std::size_t max_frame) {
  return block_on(
      env.io.executor(),
      [&]() -> awaitable<result<void>> {
        net::RpcClient client(*env.cluster->host_ptr(2));
        net::CallOptions o;
        o.timeout = 20s;
        o.max_message_size = max_frame;
        ST_CO_TRY(auto call,
                  (co_await client.bidi<Frame, Frame>(env.cluster->host_ptr(1)->local_peer(),
                                                      kForwardStreamProtocol, o)));
        for (const auto& f : frames) ST_CO_TRY(co_await call.write(f));
        ST_CO_TRY(co_await call.close_write());
        for (;;) {
          ST_CO_TRY(auto got, co_await call.read());
          if (!got) co_return success();
        }
      },
      30s);
}

TEST(MoeStream, BadStreamsRefusedAndServerKeepsServing) {
  Env env;
  auto cfg = server_config();
  cfg.forward_pool.max_batch = 64;
  cfg.max_frame_size = 64 * 1024;
  auto server = serve_one(env, make_ffn_expert(kDim, kHidden, 7), cfg);
  auto good = slice({ramp({16, kDim})}, 40);  // header + 4 chunks
  ASSERT_TRUE(send_frames(env, good, 1 << 20));
  EXPECT_EQ(server->stats().streamed_calls.load(), 1u);

  auto expect_refused = [&](std::vector<Frame> frames, const char* what) {
    const auto before = server->stats().bad_requests.load();
    auto r = send_frames(env, frames, 1 << 20);
    EXPECT_FALSE(r) << what;
    if (r) return std::string();
    EXPECT_TRUE(net::is_remote_error(r.error())) << what << ": " << r.error().message();
    EXPECT_EQ(server->stats().bad_requests.load(), before + 1) << what;
    return r.error().message();
  };
  auto truncated = good;
  truncated.pop_back();
  EXPECT_NE(expect_refused(truncated, "truncated").find("ended at value"), std::string::npos);
  auto misshaped = slice({ramp({16, kDim + 1})}, 40);
  EXPECT_NE(expect_refused(misshaped, "mis-shaped").find("the expert takes"), std::string::npos);
  auto too_many_rows = slice({ramp({65, kDim})}, 40);
  EXPECT_NE(expect_refused(too_many_rows, "rows").find("max_batch"), std::string::npos);
  auto reordered = good;
  std::swap(reordered[1], reordered[2]);
  expect_refused(reordered, "reordered");
  // A frame over max_frame_size: the RPC framework refuses it (RESOURCE_EXHAUSTED).
  auto big = slice({ramp({64, kDim})}, 64 * kDim);  // one chunk of 2 KiB values...
  big[1].mutable_chunk()->mutable_data()->append(std::string(70 * 1024, 'x'));  // ...padded
  auto r = send_frames(env, big, 1 << 20);
  ASSERT_FALSE(r);
  EXPECT_EQ(net::generic_errc(r.error()), errc::too_large) << r.error().message();

  // Through the client: a large mis-shaped request (10 MiB) is refused from its header, and
  // the client stops sending when the refusal comes.
  auto r2 = forward_to_node1(env, ramp({300000, kDim + 1}), ExpertCallOptions{});
  ASSERT_FALSE(r2);
  EXPECT_NE(r2.error().message().find("the expert takes"), std::string::npos)
      << r2.error().message();

  // A client whose chunks exceed its own frame limit fails at once, naming it.
  ExpertCallOptions small_frames;
  small_frames.stream_threshold = 64;
  small_frames.stream_chunk_values = 1 << 16;  // 256 KiB frames
  small_frames.max_frame_size = 64 * 1024;
  auto r3 = forward_to_node1(env, ramp({40000, kDim}), small_frames);
  ASSERT_FALSE(r3);
  EXPECT_EQ(r3.error(), errc::too_large) << r3.error().message();

  // Still serving.
  ASSERT_TRUE(send_frames(env, good, 1 << 20));
  EXPECT_EQ(server->stats().streamed_calls.load(), 2u);
  env.stop(server);
}

// A server answering with bad streams: the client refuses each, naming the problem.
TEST(MoeStream, BadAnswerStreamsRefusedByTheClient) {
  Env env;
  std::atomic<int> mode{0};
  auto rpc = std::make_shared<net::RpcServer>(*env.cluster->host_ptr(1));
  rpc->add_bidi<Frame, Frame>(kForwardStreamProtocol,
                              [&](const net::RpcContext&, net::RpcReader<Frame>& in,
                                  net::RpcWriter<Frame>& out) -> awaitable<result<void>> {
                                for (;;) {  // the request, whole
                                  ST_CO_TRY(auto f, co_await in.read());
                                  if (!f) break;
                                }
                                auto frames = slice({ramp({mode == 0 ? 5 : 4, kDim})}, 10);
                                if (mode == 1) frames.pop_back();                // truncated
                                if (mode == 2) std::swap(frames[1], frames[2]);  // out of order
                                for (const auto& f : frames) ST_CO_TRY(co_await out.write(f));
                                co_return success();
                              });
  ExpertCallOptions o;
  o.stream_threshold = 64;
  const char* want[] = {"answered a tensor [5, 8] for an input [4, 8]", "stream ended at value",
                        "expected tensor 0 at value 0"};
  for (int m = 0; m < 3; ++m) {
    mode = m;
    auto r = forward_to_node1(env, ramp({4, kDim}), o);
    ASSERT_FALSE(r) << m;
    EXPECT_EQ(r.error(), errc::protocol_violation) << r.error().message();
    EXPECT_NE(r.error().message().find(want[m]), std::string::npos) << r.error().message();
  }
  drop_on_io(env, rpc);
}

TEST(MoeStream, MemoryBudgetRefusesAndDeadlineEndsTheCall) {
  Env env;
  auto cfg = server_config();
  cfg.max_stream_bytes = 16 * kDim * 4;  // less than a 16-row request and its answer
  auto slow = make_ffn_expert(kDim, kHidden, 7);
  slow.forward = [f = slow.forward](const torch::Tensor& x) {
    std::this_thread::sleep_for(1500ms);  // a slow expert (the server's runtime thread)
    return f(x);
  };
  auto server = serve_one(env, std::move(slow), cfg);
  ExpertCallOptions o;
  o.stream_threshold = 64;
  auto r = forward_to_node1(env, ramp({16, kDim}), o);
  ASSERT_FALSE(r);
  EXPECT_EQ(net::generic_errc(r.error()), errc::too_large) << r.error().message();
  EXPECT_EQ(server->stats().refused.load(), 1u);

  o.timeout = 300ms;  // the whole streamed call, the expert takes 1.5 s
  const auto t0 = Clock::now();
  auto late = forward_to_node1(env, ramp({4, kDim}), o);
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error(), errc::timeout) << late.error().message();
  EXPECT_LT(Clock::now() - t0, 1200ms);
  env.stop(server);
}

}  // namespace
}  // namespace starling::moe
