// bench_moe_chain: latency hiding (Learning@home's throughput experiment, scaled). A chain of
// 16 expert blocks (built-in FFN, 256 -> 1024 -> 256, SGD) served by 2 ExpertServers (block i
// on server i % 2, own Hosts and io thread). A trainer step sends a batch forward through the
// 16 blocks, then its gradient backward through them in reverse (32 RPCs); before every hop it
// waits L * Exp(1), the injected network delay. Trainers are coroutines on a client io thread.
// For each L in {0, 10, 50, 100, 200} ms it measures 1 trainer and 32 concurrent trainers:
// samples/s = sum over trainers of (steps after its first) * batch / (time between its first
// and last step). Anchor in the same run: the same 16 blocks run in-process on one thread
// (forward, backward, SGD step). Prints the figures, the ratios the issue names (32 trainers
// vs 1 at L = 100; 32 trainers at L = 100 vs at L = 0) and `RESULT {json}`.
//
//   bench_moe_chain [--steps 3] [--batch 128] [--trainers 32] [--latencies 0,10,50,100,200]
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "bench_host.hpp"
#include "starling/core/blocking.hpp"
#include "starling/moe/client.hpp"
#include "starling/moe/expert_server.hpp"

using namespace starling;
using namespace starling::moe;

namespace {

constexpr std::int64_t kDim = 256;
constexpr std::int64_t kHidden = 1024;
constexpr int kBlocks = 16;
constexpr double kLr = 1e-7;  // random gradients, no loss to descend: keeps values finite

std::string block_uid(int i) {
  return "chain." + std::to_string(i);
}

struct Run {
  int steps_wanted = 3;  // per trainer (>= 2: the rate is taken between the first and last)
  // Rows per step: at 128 the compute of a step is comparable to the injected latency (as in
  // Learning@home, whose blocks dominate); at 16, 32 trainers stay latency-bound at L = 100.
  std::int64_t batch = 128;
  Duration latency{};
  std::vector<ExpertAddress> hops;  // per block
  std::shared_ptr<net::Host> host;
  // Per trainer: completion times of its steps.
  std::vector<std::vector<TimePoint>> done;
  int failed = 0;
};

awaitable<void> trainer(Run& run, std::size_t t, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> exp1(1.0);
  std::normal_distribution<float> normal;
  auto delay = [&]() -> awaitable<void> {
    if (run.latency > Duration::zero()) {
      const auto d = std::chrono::duration_cast<Duration>(run.latency * exp1(rng));
      (void)co_await sleep_for(d);
    }
  };
  ExpertCallOptions opts;
  opts.timeout = 120s;
  TensorData x{{run.batch, kDim}, std::vector<float>(static_cast<std::size_t>(run.batch * kDim))};
  while (static_cast<int>(run.done[t].size()) < run.steps_wanted) {
    for (auto& v : x.values) v = normal(rng);
    std::vector<TensorData> inputs;
    std::vector<std::uint64_t> steps;
    TensorData h = x;
    bool ok = true;
    for (int i = 0; i < kBlocks && ok; ++i) {
      co_await delay();
      auto r = co_await call_forward(*run.host, run.hops[i], h, opts);
      if (!r) {
        ok = false;
        break;
      }
      inputs.push_back(std::move(h));
      steps.push_back(r.value().expert_step);
      h = std::move(r.value().tensor);
    }
    // d(mean of 0.5 * |y|^2)/dy = y / batch.
    for (auto& v : h.values) v /= static_cast<float>(run.batch);
    for (int i = kBlocks - 1; i >= 0 && ok; --i) {
      co_await delay();
      auto r = co_await call_backward(*run.host, run.hops[i], inputs[i], h, opts, steps[i]);
      if (!r) {
        ok = false;
        break;
      }
      h = std::move(r.value().tensor);
    }
    if (!ok) {
      ++run.failed;
      if (run.failed > 100) co_return;
      continue;
    }
    run.done[t].push_back(Clock::now());
  }
}

// samples/s of `trainers` concurrent trainers at `latency`.
double measure(IoThread& io, Run base, int trainers, int* failed) {
  base.done.assign(static_cast<std::size_t>(trainers), {});
  Run* run = &base;
  (void)block_on(
      io.executor(),
      [run, trainers]() -> awaitable<result<void>> {
        TaskScope scope(co_await asio::this_coro::executor);
        for (int t = 0; t < trainers; ++t)
          scope.spawn(trainer(*run, static_cast<std::size_t>(t), 1000 + t));
        (void)co_await scope.join(std::chrono::minutes(30));  // the trainers end on their own
        (void)co_await scope.close(5s);
        co_return success();
      },
      std::chrono::hours(1));
  double rate = 0;
  for (const auto& d : base.done)
    if (d.size() >= 2)
      rate += static_cast<double>(d.size() - 1) * static_cast<double>(base.batch) /
              std::chrono::duration<double>(d.back() - d.front()).count();
  *failed = base.failed;
  return rate;
}

double load_average() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  Run base;
  int many = 32;
  std::vector<int> latencies{0, 10, 50, 100, 200};
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps") base.steps_wanted = std::max(2, std::atoi(argv[i + 1]));
    if (a == "--batch") base.batch = std::atoll(argv[i + 1]);
    if (a == "--trainers") many = std::atoi(argv[i + 1]);
    if (a == "--latencies") {
      latencies.clear();
      std::stringstream ss(argv[i + 1]);
      for (std::string p; std::getline(ss, p, ',');) latencies.push_back(std::stoi(p));
    }
  }
  torch::set_num_threads(1);
  const double load_before = load_average();

  // Anchor: the chain in-process, one thread.
  std::vector<ExpertModule> local;
  std::vector<std::unique_ptr<torch::optim::SGD>> opt;
  for (int i = 0; i < kBlocks; ++i) {
    local.push_back(make_ffn_expert(kDim, kHidden, 100 + i));
    opt.push_back(std::make_unique<torch::optim::SGD>(local.back().parameters->parameters(),
                                                      torch::optim::SGDOptions(kLr)));
  }
  const int local_steps = 20;
  auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < local_steps; ++s) {
    auto h = torch::randn({base.batch, kDim});
    for (auto& b : local) h = b.forward(h);
    (0.5 * h.square().sum(1).mean()).backward();
    for (auto& o : opt) {
      o->step();
      o->zero_grad();
    }
  }
  const double local_rate =
      local_steps * static_cast<double>(base.batch) /
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  IoThread sio("chain-server-io");
  IoThread cio("chain-client-io");
  std::vector<std::shared_ptr<ExpertServer>> servers;
  std::vector<std::shared_ptr<net::Host>> server_hosts;
  for (int s = 0; s < 2; ++s) {
    server_hosts.push_back(bench::start_host_or_exit(sio));
    servers.push_back(ExpertServer::create(server_hosts.back(), nullptr, ExpertServerConfig{}));
  }
  for (int i = 0; i < kBlocks; ++i) {
    auto& host = server_hosts[static_cast<std::size_t>(i % 2)];
    if (!servers[static_cast<std::size_t>(i % 2)]->add_expert(
            block_uid(i), make_ffn_expert(kDim, kHidden, 100 + i), sgd_factory(kLr)))
      return 1;
    base.hops.push_back(ExpertAddress{block_uid(i), host->local_peer(), host->listen_addresses()});
  }
  for (auto& s : servers)
    if (!block_on(
            sio.executor(), [s] { return s->start(); }, 10s))
      return 1;
  base.host = bench::start_host_or_exit(cio);

  nlohmann::json out;
  out["local_samples_per_s"] = local_rate;
  std::printf("anchor: the 16 blocks in-process, one thread: %.1f samples/s (batch %lld)\n",
              local_rate, static_cast<long long>(base.batch));
  std::map<int, std::pair<double, double>> rates;  // L -> (1 trainer, many)
  for (int L : latencies) {
    Run r = base;
    r.latency = std::chrono::milliseconds(L);
    int f1 = 0, fm = 0;
    const double one = measure(cio, r, 1, &f1);
    const double all = measure(cio, r, many, &fm);
    rates[L] = {one, all};
    std::printf(
        "L = %3d ms: 1 trainer %.1f samples/s | %d trainers %.1f samples/s (x%.1f) | "
        "failed steps %d | load %.2f\n",
        L, one, many, all, all / one, f1 + fm, load_average());
    out["L" + std::to_string(L)] = {{"one", one}, {"many", all}, {"failed", f1 + fm}};
  }
  if (rates.count(100) && rates.count(0)) {
    const double vs_one = rates[100].second / rates[100].first;
    const double vs_l0 = rates[100].second / rates[0].second;
    std::printf(
        "L = 100 ms: %d trainers / 1 trainer = %.1f (target >= 10); %d trainers at L = 100 / "
        "at L = 0 = %.2f (target >= 0.5); at L = 0 vs the in-process anchor %.2f\n",
        many, vs_one, many, vs_l0, rates[0].second / local_rate);
    out["ratio_many_vs_one_L100"] = vs_one;
    out["ratio_L100_vs_L0"] = vs_l0;
  }
  out["trainers"] = many;
  out["batch"] = base.batch;
  out["load_before"] = load_before;
  out["load_after"] = load_average();
  std::printf("load average %.2f before / %.2f after\n", load_before, load_average());
  std::printf("RESULT %s\n", out.dump().c_str());
  (void)block_on(
      sio.executor(),
      [&]() -> awaitable<result<void>> {
        for (auto& s : servers) co_await s->stop();
        for (auto& h : server_hosts) co_await h->stop();
        co_return success();
      },
      30s);
  (void)block_on(
      cio.executor(),
      [&]() -> awaitable<result<void>> {
        co_await base.host->stop();
        co_return success();
      },
      30s);
  (void)sio.stop();
  (void)cio.stop();
  return 0;
}
