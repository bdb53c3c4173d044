// End to end over loopback: expert servers declared in a real DHT (3 in-process DHT nodes),
// RemoteExpert forward/backward against the same module run locally, the server's optimizer
// stepping on backward, beam search through the DHT, a killed server skipped and expiring, and
// bad requests answered with errors while the server keeps serving.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <thread>

#include "moe/moe_env.hpp"
#include "starling/averaging/dht_directory.hpp"
#include "starling/core/blocking.hpp"
#include "starling/moe/expert_server.hpp"
#include "starling/moe/remote.hpp"
#include "starling/pb/moe.pb.h"

namespace starling::moe {
namespace {

using namespace test;
using dht::test::quick_config;

TEST(MoeRemote, ForwardBackwardMatchLocalAndOptimizerSteps) {
  Env env;
  auto server = env.serve(1, "ffn.[0:2].[0:2]");
  const std::string uid = "ffn.1.0";
  auto local = make_ffn_expert(kDim, kHidden, seed_of(uid));
  {
    auto remote_params = server->module_of(uid)->parameters();
    auto local_params = local.parameters->parameters();
    ASSERT_EQ(remote_params.size(), local_params.size());
    for (std::size_t i = 0; i < local_params.size(); ++i)
      ASSERT_TRUE(torch::equal(remote_params[i], local_params[i]));
  }
  RemoteExpert remote(env.cluster->host_ptr(2), env.address(1, uid));
  auto schema = remote.info();
  ASSERT_TRUE(schema) << schema.error().message();
  EXPECT_EQ(schema.value().input_shape, (std::vector<std::int64_t>{kDim}));

  torch::manual_seed(3);
  expect_remote_matches_local(remote, local, torch::randn({5, kDim}), torch::randn({5, kDim}));

  // The server stepped SGD once on the same gradient.
  torch::optim::SGD opt(local.parameters->parameters(), torch::optim::SGDOptions(kLr));
  opt.step();
  EXPECT_GE(server->stats().optimizer_steps.load(), 1u);
  expect_params_close(*server->module_of(uid), *local.parameters, "after one step");
  env.stop(server);
}

TEST(MoeRemote, BeamSearchThroughDhtMatchesExhaustive) {
  Env env;
  auto server = env.serve(1, "ffn.[0:3].[0:2]");
  auto dir = env.directory(0);
  std::vector<std::vector<std::uint32_t>> alive;
  for (std::uint32_t a = 0; a < 3; ++a)
    for (std::uint32_t b = 0; b < 2; ++b) alive.push_back({a, b});
  std::vector<std::vector<std::vector<float>>> scores{
      {{0.1f, 2.0f, -1.0f, 5.0f}, {0.3f, -0.2f, 9.0f}},
      {{1.0f, 0.0f, 0.5f, 0.0f}, {0.0f, 1.0f, 0.0f}}};
  auto r = block_on(
      env.io.executor(), [&] { return dir->beam_search("ffn", scores, 3, 10s); }, 20s);
  ASSERT_TRUE(r) << r.error().message();
  for (std::size_t i = 0; i < scores.size(); ++i) {
    auto want = exhaustive_top_k(scores[i], alive, 3);
    const auto& got = r.value().at(i);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t j = 0; j < got.size(); ++j) {
      EXPECT_NEAR(got[j].score, want[j].score, 1e-5);
      ASSERT_FALSE(got[j].servers.empty());
      EXPECT_EQ(got[j].servers[0].peer, env.cluster->host_ptr(1)->local_peer());
    }
  }
  env.stop(server);
}

TEST(MoeRemote, KilledServerIsSkippedAndExpires) {
  Env env;
  auto a = env.serve(1, "ffn.[0:2].[0:2]");
  // Server b on a fourth DHT node, so killing it leaves the DHT whole.
  auto added = block_on(
      env.io.executor(), [&] { return env.cluster->add(quick_config()); }, 60s);
  ASSERT_TRUE(added) << added.error().message();
  auto b = env.serve(3, "ffn.2.[0:2]");
  auto dir = env.directory(2);
  ASSERT_EQ(env.alive(dir, {3, 2}).size(), 6u);

  MoeOptions o;
  o.grid_size = {3, 2};
  o.in_features = kDim;
  o.out_features = kDim;
  o.k = 6;
  o.k_min = 1;
  o.forward_timeout = 5s;
  o.timeout_after_k_min = 1s;
  o.backward_timeout = 5s;
  RemoteMixtureOfExperts moe(o, env.cluster->host_ptr(2), dir);
  torch::manual_seed(5);
  auto x = torch::randn({4, kDim}).requires_grad_(true);
  auto y = moe->forward(x);
  EXPECT_EQ(y.sizes(), (std::vector<std::int64_t>{4, kDim}));
  y.sum().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_EQ(moe->stats().forward_failures, 0u);
  EXPECT_EQ(moe->stats().rows_per_expert.count("ffn.2.1"), 1u);

  // Kill b's host and DHT node (its declarations stay in the DHT until they expire).
  (void)block_on(
      env.io.executor(),
      [&]() -> awaitable<result<void>> {
        co_await env.cluster->stop(3);
        co_return success();
      },
      30s);
  const auto t0 = Clock::now();
  auto y2 = moe->forward(x.detach());
  const auto took = Clock::now() - t0;
  EXPECT_LT(took, o.forward_timeout) << "waited for the dead server";
  EXPECT_EQ(y2.sizes(), (std::vector<std::int64_t>{4, kDim}));
  EXPECT_TRUE(torch::isfinite(y2).all().item<bool>());

  // b's experts vanish from the DHT within the ttl (2s) plus the lookup cache.
  const auto deadline = Clock::now() + 15s;
  std::set<std::string> now;
  do {
    now = env.alive(dir, {3, 2});
    if (now.size() == 4u) break;
    std::this_thread::sleep_for(200ms);  // polling a DHT expiry, bounded by the deadline
  } while (Clock::now() < deadline);
  EXPECT_EQ(now, (std::set<std::string>{"ffn.0.0", "ffn.0.1", "ffn.1.0", "ffn.1.1"}));
  std::printf(
      "dead server's forward took %lld ms; its experts gone %lld ms after it died\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()),
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()));
  env.stop(b);
  env.stop(a);
}

TEST(MoeRemote, SlowExpertsAreMaskedNotWaitedFor) {
  Env env;
  auto a = env.serve(1, "ffn.[0:2].[0:2]");
  auto b = env.serve(0, "ffn.2.[0:2]", 2s);
  auto dir = env.directory(2);
  ASSERT_EQ(env.alive(dir, {3, 2}).size(), 6u);
  MoeOptions o;
  o.grid_size = {3, 2};
  o.in_features = kDim;
  o.out_features = kDim;
  o.k = 6;
  o.k_min = 1;
  o.forward_timeout = 10s;
  o.timeout_after_k_min = 300ms;
  RemoteMixtureOfExperts moe(o, env.cluster->host_ptr(2), dir);
  auto x = torch::randn({3, kDim}).requires_grad_(true);
  const auto t0 = Clock::now();
  auto y = moe->forward(x);
  const auto took = Clock::now() - t0;
  EXPECT_LT(took, 1500ms) << "waited for the slow experts";
  EXPECT_TRUE(torch::isfinite(y).all().item<bool>());
  EXPECT_GE(moe->stats().forward_late, 1u);
  y.sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(torch::isfinite(x.grad()).all().item<bool>());
  // Backward went only to the experts that answered (the fast server's 4).
  EXPECT_EQ(b->stats().backward_batches.load(), 0u);
  EXPECT_GE(a->stats().backward_batches.load(), 1u);
  env.stop(b);
  env.stop(a);
}

TEST(MoeRemote, AllExpertsGoneGivesClearErrorWithinDeadline) {
  Env env;
  auto a = env.serve(1, "ffn.0.[0:2]");
  auto dir = env.directory(2, 30s);  // the cache keeps the stale declarations
  ASSERT_EQ(env.alive(dir, {1, 2}).size(), 2u);
  env.stop(a);  // the host stays up: calls get "protocol not supported" at once
  MoeOptions o;
  o.grid_size = {1, 2};
  o.in_features = kDim;
  o.out_features = kDim;
  o.k = 2;
  o.forward_timeout = 3s;
  RemoteMixtureOfExperts moe(o, env.cluster->host_ptr(2), dir);
  const auto t0 = Clock::now();
  std::string what;
  try {
    (void)moe->forward(torch::randn({2, kDim}));
  } catch (const std::exception& e) {
    what = e.what();
  }
  EXPECT_LT(Clock::now() - t0, o.forward_timeout + 1s);
  EXPECT_NE(what.find("no expert answered"), std::string::npos) << what;
}

TEST(MoeRemote, StopWithRequestsInFlightIsBounded) {
  Env env;
  auto dir = std::make_shared<averaging::DhtDirectory>(env.cluster->node_ptr(1));
  auto cfg = server_config();
  cfg.stop_timeout = 1s;
  auto s = ExpertServer::create(env.cluster->host_ptr(1), dir, cfg);
  auto started = std::make_shared<std::promise<void>>();
  auto once = std::make_shared<std::once_flag>();
  auto m = make_ffn_expert(kDim, kHidden, 1);
  m.forward = [f = m.forward, started, once](const torch::Tensor& x) {
    std::call_once(*once, [&] { started->set_value(); });
    std::this_thread::sleep_for(500ms);  // a slow batch running while stop() is called
    return f(x);
  };
  ASSERT_TRUE(s->add_expert("ffn.0.0", std::move(m), sgd_factory(kLr)));
  ASSERT_TRUE(block_on(
      env.io.executor(), [s] { return s->start(); }, 30s));
  auto host = env.cluster->host_ptr(2);
  auto to = env.address(1, "ffn.0.0");
  std::vector<CallFn> calls;
  for (int i = 0; i < 8; ++i)
    calls.push_back([host, to]() {
      TensorData t{{1, kDim}, std::vector<float>(kDim, 0.25f)};
      ExpertCallOptions o;
      o.timeout = 10s;
      return call_forward(*host, to, t, o);
    });
  std::vector<std::optional<result<ExpertAnswer>>> res;
  std::thread caller(
      [&] { res = run_calls(env.io.executor(), std::move(calls), Clock::now() + 15s); });
  ASSERT_EQ(started->get_future().wait_for(10s), std::future_status::ready);
  const auto t0 = Clock::now();
  env.stop(s);
  const auto stop_took = Clock::now() - t0;
  caller.join();
  EXPECT_LT(stop_took, 2 * cfg.stop_timeout + 1s);
  std::size_t ended = 0;
  for (auto& r : res)
    if (r) ++ended;
  EXPECT_EQ(ended, 8u) << "a call was still running at its deadline";
  // The server is gone: a new call fails fast instead of hanging.
  TensorData t{{1, kDim}, std::vector<float>(kDim, 0.25f)};
  ExpertCallOptions o;
  o.timeout = 5s;
  const auto t1 = Clock::now();
  auto late = block_on(
      env.io.executor(), [&] { return call_forward(*host, to, t, o); }, 10s);
  EXPECT_FALSE(late);
  EXPECT_LT(Clock::now() - t1, 4s);
}

TEST(MoeRemote, BadRequestsGetErrorsAndServerKeepsServing) {
  Env env;
  auto server = env.serve(1, "ffn.0.[0:2]");
  auto host = env.cluster->host_ptr(2);
  auto to = env.address(1, "ffn.0.1");
  ExpertCallOptions opts;
  opts.timeout = 5s;
  auto call = [&](ExpertAddress addr, TensorData t) {
    return block_on(
        env.io.executor(), [&] { return call_forward(*host, addr, t, opts); }, 10s);
  };
  TensorData wrong{{3, kDim + 1}, std::vector<float>(3 * (kDim + 1), 1.0f)};
  auto r = call(to, wrong);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("shape"), std::string::npos) << r.error().message();

  auto unknown = env.address(1, "ffn.9.9");
  TensorData good{{2, kDim}, std::vector<float>(2 * kDim, 0.5f)};
  r = call(unknown, good);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("ffn.9.9"), std::string::npos) << r.error().message();

  // Garbage protobuf: a MoeTensor's packed negative shape is not a valid ExpertRequest.
  pb::MoeTensor junk;
  junk.add_shape(-1);
  junk.add_shape(-200);
  auto raw = block_on(
      env.io.executor(),
      [&]() -> awaitable<result<pb::ExpertResponse>> {
        net::RpcClient client(*host);
        net::CallOptions co;
        co.timeout = 5s;
        co_return co_await client.unary<pb::MoeTensor, pb::ExpertResponse>(
            to.peer, kForwardProtocol, junk, co);
      },
      10s);
  EXPECT_FALSE(raw);

  r = call(to, good);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value().tensor.shape, (std::vector<std::int64_t>{2, kDim}));
  EXPECT_GE(server->stats().bad_requests.load(), 2u);
  env.stop(server);
}

}  // namespace
}  // namespace starling::moe
