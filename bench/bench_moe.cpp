// bench_moe: a RemoteExpert over loopback beside the same expert run locally in-process (the
// anchor), in the same run. The expert is the built-in feed-forward block (256 -> hidden 1024
// -> 256, SGD); the remote side is an ExpertServer on its own Host; the client is a second
// Host on the same io thread, calling from the bench's thread as a trainer does. Measures
//   forward only:        p50/p99 of one call, remote and local, and remote minus local;
//   forward + backward:  p50/p99 of one step (forward, backward, the expert's SGD step),
//                        and rows/s, for batch sizes 1 and 32;
//   batching:            the server's mean batch under 64 concurrent one-row forwards;
//   concurrent clients:  rows/s of 8 client threads calling forward + backward of 4 experts
//                        on a server with its own io thread, beside the same calls run
//                        locally on one thread (the server's runtime is one thread).
// The forward-only figures are taken last (right after the hosts start, calls were observed
// to take a few ms more for a while). Torch runs on one thread on both sides. Prints the figures
// and ratios, then `RESULT {json}`.
//
//   bench_moe [--reps N] [--clients 8] [--client-batch 16]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "bench_host.hpp"
#include "starling/core/blocking.hpp"
#include "starling/moe/expert_server.hpp"
#include "starling/moe/remote.hpp"

using namespace starling;
using namespace starling::moe;

namespace {

constexpr std::int64_t kDim = 256;
constexpr std::int64_t kHidden = 1024;
// The benchmark backpropagates random output gradients (no loss to descend): a tiny learning
// rate keeps the parameters finite over thousands of steps; the step costs the same.
constexpr double kLr = 1e-7;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct Stats {
  double p50 = 0, p99 = 0, mean = 0;
};
Stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  s.p50 = v[v.size() / 2];
  s.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  return s;
}

template <class F>
Stats time_it(int reps, F f) {
  for (int i = 0; i < std::max(3, reps / 20); ++i) f();  // warm up
  std::vector<double> v;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    v.push_back(ms_since(t0));
  }
  return summarize(v);
}

// Server throughput: 4 experts on their own Host and io thread, `clients` threads each
// calling forward + backward of [batch, 256] on the experts in turn, beside the anchor: the
// same calls (expert, batch) run locally on one thread (the server computes on one runtime
// thread: equal threads). rows/s of both and their ratio.
nlohmann::json concurrent_clients(int clients, std::int64_t batch, int steps_per_client) {
  IoThread sio("bench-moe-server-io");
  IoThread cio("bench-moe-client-io");
  auto server_host = bench::start_host_or_exit(sio);
  auto client_host = bench::start_host_or_exit(cio);
  auto server = ExpertServer::create(server_host, nullptr, ExpertServerConfig{});
  constexpr int kExperts = 4;
  std::vector<ExpertModule> local;
  std::vector<std::unique_ptr<torch::optim::SGD>> local_opt;
  for (int e = 0; e < kExperts; ++e) {
    const std::string uid = "ffn.0." + std::to_string(e);
    if (!server->add_expert(uid, make_ffn_expert(kDim, kHidden, 10 + e), sgd_factory(kLr)))
      std::exit(1);
    local.push_back(make_ffn_expert(kDim, kHidden, 10 + e));
    local_opt.push_back(std::make_unique<torch::optim::SGD>(local.back().parameters->parameters(),
                                                            torch::optim::SGDOptions(kLr)));
  }
  if (!block_on(
          sio.executor(), [server] { return server->start(); }, 10s))
    std::exit(1);
  auto x = torch::randn({batch, kDim});
  auto g = torch::randn({batch, kDim});
  // Anchor: the same calls, one thread, in-process.
  const int total = clients * steps_per_client;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < total; ++i) {
    auto& e = local[static_cast<std::size_t>(i % kExperts)];
    auto xi = x.clone().requires_grad_(true);
    e.forward(xi).backward(g);
    local_opt[static_cast<std::size_t>(i % kExperts)]->step();
    local_opt[static_cast<std::size_t>(i % kExperts)]->zero_grad();
  }
  const double local_s = ms_since(t0) / 1000.0;
  // Remote: `clients` threads.
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  t0 = std::chrono::steady_clock::now();
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      std::vector<RemoteExpert> experts;
      for (int e = 0; e < kExperts; ++e)
        experts.emplace_back(client_host,
                             ExpertAddress{"ffn.0." + std::to_string(e), server_host->local_peer(),
                                           server_host->listen_addresses()});
      for (int i = 0; i < steps_per_client; ++i) {
        try {
          auto xi = x.clone().requires_grad_(true);
          experts[static_cast<std::size_t>((c + i) % kExperts)].forward(xi).backward(g);
        } catch (const std::exception&) {
          ++failed;
        }
      }
    });
  for (auto& t : threads) t.join();
  const double remote_s = ms_since(t0) / 1000.0;
  const double rows = static_cast<double>(total) * static_cast<double>(batch);
  const double local_rps = rows / local_s, remote_rps = rows / remote_s;
  const auto& st = server->stats();
  const double mean_batch = static_cast<double>(st.backward_rows.load()) /
                            std::max<double>(1, static_cast<double>(st.backward_batches.load()));
  std::printf(
      "%d clients x %d forward+backward [%lld,%lld] over 4 experts: remote %.0f rows/s "
      "(%d failed, mean backward batch %.1f rows) | local, one thread %.0f rows/s | ratio %.2f\n",
      clients, steps_per_client, static_cast<long long>(batch), static_cast<long long>(kDim),
      remote_rps, failed.load(), mean_batch, local_rps, remote_rps / local_rps);
  (void)block_on(
      sio.executor(),
      [&]() -> awaitable<result<void>> {
        co_await server->stop();
        co_await server_host->stop();
        co_return success();
      },
      20s);
  (void)block_on(
      cio.executor(),
      [&]() -> awaitable<result<void>> {
        co_await client_host->stop();
        co_return success();
      },
      20s);
  (void)sio.stop();
  (void)cio.stop();
  return {{"clients", clients},
          {"batch", batch},
          {"remote_rows_per_s", remote_rps},
          {"local_rows_per_s", local_rps},
          {"ratio", remote_rps / local_rps},
          {"mean_backward_batch", mean_batch},
          {"failed", failed.load()}};
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 300, clients = 8;
  std::int64_t client_batch = 16;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
    if (a == "--clients") clients = std::atoi(argv[i + 1]);
    if (a == "--client-batch") client_batch = std::atoll(argv[i + 1]);
  }
  torch::set_num_threads(1);
  nlohmann::json out;
  out["concurrent_clients"] = concurrent_clients(clients, client_batch, std::max(10, reps / 4));
  IoThread io("bench-moe-io");
  auto start_host = [&] { return bench::start_host_or_exit(io); };
  auto server_host = start_host();
  auto client_host = start_host();
  ExpertServerConfig cfg;
  cfg.forward_pool.max_wait = 0ms;
  cfg.backward_pool.max_wait = 0ms;
  std::shared_ptr<ExpertServer> server = ExpertServer::create(server_host, nullptr, cfg);
  const std::string uid = "ffn.0.0";
  if (!server->add_expert(uid, make_ffn_expert(kDim, kHidden, 1), sgd_factory(kLr))) return 1;
  if (!block_on(
          io.executor(), [server] { return server->start(); }, 10s))
    return 1;

  auto local = make_ffn_expert(kDim, kHidden, 1);
  torch::optim::SGD local_opt(local.parameters->parameters(), torch::optim::SGDOptions(kLr));
  RemoteExpert remote(
      client_host, ExpertAddress{uid, server_host->local_peer(), server_host->listen_addresses()});
  if (!remote.info()) return 1;

  for (std::int64_t batch : {1, 32}) {
    auto x = torch::randn({batch, kDim});
    auto g = torch::randn({batch, kDim});
    auto sl = time_it(reps, [&] {
      auto xi = x.clone().requires_grad_(true);
      local_opt.zero_grad();
      local.forward(xi).backward(g);
      local_opt.step();
    });
    auto sr = time_it(reps, [&] {
      auto xi = x.clone().requires_grad_(true);
      remote.forward(xi).backward(g);
    });
    const double rows_l = static_cast<double>(batch) * 1000.0 / sl.mean;
    const double rows_r = static_cast<double>(batch) * 1000.0 / sr.mean;
    std::printf(
        "forward+backward+step [%lld,%lld]: local p50 %.3f ms p99 %.3f (%.0f rows/s) | "
        "remote p50 %.3f ms p99 %.3f (%.0f rows/s) | remote/local throughput %.2f\n",
        static_cast<long long>(batch), static_cast<long long>(kDim), sl.p50, sl.p99, rows_l, sr.p50,
        sr.p99, rows_r, rows_r / rows_l);
    out["step_" + std::to_string(batch)] = {{"local_p50_ms", sl.p50},
                                            {"local_p99_ms", sl.p99},
                                            {"local_rows_per_s", rows_l},
                                            {"remote_p50_ms", sr.p50},
                                            {"remote_p99_ms", sr.p99},
                                            {"remote_rows_per_s", rows_r},
                                            {"throughput_ratio", rows_r / rows_l}};
  }
  // Forward only, one row.
  auto x1 = torch::randn({1, kDim});
  auto fl = time_it(reps, [&] {
    torch::NoGradGuard ng;
    (void)local.forward(x1);
  });
  auto fr = time_it(reps, [&] {
    torch::NoGradGuard ng;
    (void)remote.forward(x1);
  });
  std::printf(
      "forward [1,%lld]: local p50 %.3f ms p99 %.3f | remote p50 %.3f ms p99 %.3f | "
      "overhead p50 %.3f ms p99 %.3f\n",
      static_cast<long long>(kDim), fl.p50, fl.p99, fr.p50, fr.p99, fr.p50 - fl.p50,
      fr.p99 - fl.p99);
  out["forward_1"] = {{"local_p50_ms", fl.p50},
                      {"local_p99_ms", fl.p99},
                      {"remote_p50_ms", fr.p50},
                      {"remote_p99_ms", fr.p99},
                      {"overhead_p50_ms", fr.p50 - fl.p50},
                      {"overhead_p99_ms", fr.p99 - fl.p99}};

  // 64 concurrent one-row forward requests: how the server batches them (max_wait 2 ms).
  {
    auto s2 = ExpertServer::create(server_host, nullptr, ExpertServerConfig{});
    (void)block_on(
        io.executor(),
        [server]() -> awaitable<result<void>> {
          co_await server->stop();
          co_return success();
        },
        10s);
    if (!s2->add_expert(uid, make_ffn_expert(kDim, kHidden, 1), sgd_factory(kLr))) return 1;
    if (!block_on(
            io.executor(), [s2] { return s2->start(); }, 10s))
      return 1;
    server = s2;
    TensorData one{{1, kDim}, std::vector<float>(kDim, 0.5f)};
    ExpertAddress to{uid, server_host->local_peer(), server_host->listen_addresses()};
    const int rounds = std::max(5, reps / 50);
    const auto b0 = server->stats().forward_batches.load();
    const auto r0 = server->stats().forward_rows.load();
    std::vector<double> round_ms;
    std::size_t failed = 0;
    for (int r = 0; r < rounds; ++r) {
      std::vector<CallFn> calls;
      for (int i = 0; i < 64; ++i)
        calls.push_back([client_host, to, one]() {
          return call_forward(*client_host, to, one, ExpertCallOptions{});
        });
      auto t0 = std::chrono::steady_clock::now();
      auto res = run_calls(io.executor(), std::move(calls), Clock::now() + 20s);
      round_ms.push_back(ms_since(t0));
      for (auto& x : res)
        if (!x || !x->has_value()) ++failed;
    }
    const double batches = static_cast<double>(server->stats().forward_batches.load() - b0);
    const double rows = static_cast<double>(server->stats().forward_rows.load() - r0);
    auto st = summarize(round_ms);
    std::printf(
        "64 concurrent [1,%lld] forwards: mean batch %.1f rows (%d rounds, %zu failed), "
        "round p50 %.2f ms, %.0f rows/s\n",
        static_cast<long long>(kDim), rows / batches, rounds, failed, st.p50,
        64.0 * 1000.0 / st.mean);
    out["concurrent_64"] = {{"mean_batch", rows / batches},
                            {"round_p50_ms", st.p50},
                            {"rows_per_s", 64.0 * 1000.0 / st.mean},
                            {"failed", failed}};
  }
  std::printf("server: %llu forward batches, %llu backward batches, %llu optimizer steps\n",
              static_cast<unsigned long long>(server->stats().forward_batches.load()),
              static_cast<unsigned long long>(server->stats().backward_batches.load()),
              static_cast<unsigned long long>(server->stats().optimizer_steps.load()));
  std::printf("RESULT %s\n", out.dump().c_str());
  (void)block_on(
      io.executor(),
      [&]() -> awaitable<result<void>> {
        co_await server->stop();
        co_await client_host->stop();
        co_await server_host->stop();
        co_return success();
      },
      20s);
  (void)io.stop();
  return 0;
}
