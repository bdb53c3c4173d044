// bench_moe_convergence: the Fashion-MNIST DMoE model (784 -> 64, a 4x4 grid of FFN experts
// 64 -> 128 -> 64 with k = 4, 64 -> 10; the fashion-moe task's model) trained at equal samples
// (the same batches in the same order, the same initial parameters) four ways in one run:
//   local:        the anchor: gating, exact top-4 and the 16 experts in-process (each expert
//                 with its own Adam stepping when it got rows, as a server does);
//   remote:       RemoteMixtureOfExperts over loopback, 4 ExpertServers of 4 experts each;
//   remote-fail:  the same with 10% of the servers' forward/backward calls failing (injected);
//   remote-kill:  the same without injection, one server of 4 (25%) stopped halfway;
//   remote-swarm: the same, the servers stepping each expert once per 64 rows (SWARM steps:
//                 gradients accumulated in between, staleness bound 1).
// Prints test accuracy (10,000 test images), training wall time and the differences from the
// anchor, then `RESULT {json}`. Torch on one thread everywhere.
//
//   bench_moe_convergence [--steps N] [--batch B]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "bench_host.hpp"
#include "starling/core/blocking.hpp"
#include "starling/moe/expert_server.hpp"
#include "starling/moe/remote.hpp"
#include "starling/optim/fashion_task.hpp"

using namespace starling;
using namespace starling::moe;

namespace {

constexpr std::int64_t kWidth = 64, kHidden = 128, kGrid = 4, kK = 4;
constexpr double kLr = 1e-3;

std::uint64_t expert_seed(std::int64_t i, std::int64_t j) {
  return 1000 + static_cast<std::uint64_t>(i * kGrid + j);
}

// The anchor's mixture: the same gating (sum of per-dimension scores), exact top-k over the
// full grid, softmax over the chosen, every expert local.
struct LocalMoe {
  torch::nn::Linear proj{kWidth, 2 * kGrid};
  std::vector<ExpertModule> experts;
  std::vector<std::unique_ptr<torch::optim::Adam>> opts;
  std::vector<bool> used;
  LocalMoe() {
    for (std::int64_t i = 0; i < kGrid; ++i)
      for (std::int64_t j = 0; j < kGrid; ++j) {
        experts.push_back(make_ffn_expert(kWidth, kHidden, expert_seed(i, j)));
        opts.push_back(std::make_unique<torch::optim::Adam>(experts.back().parameters->parameters(),
                                                            torch::optim::AdamOptions(kLr)));
      }
    used.assign(experts.size(), false);
  }
  torch::Tensor forward(const torch::Tensor& h) {
    auto logits = proj->forward(h);
    auto scores =
        (logits.narrow(1, 0, kGrid).unsqueeze(2) + logits.narrow(1, kGrid, kGrid).unsqueeze(1))
            .reshape({h.size(0), kGrid * kGrid});
    auto [gate, idx] = scores.topk(kK, 1);
    auto w = torch::softmax(gate, 1);
    auto out = torch::zeros({h.size(0), kWidth});
    for (std::size_t e = 0; e < experts.size(); ++e) {
      auto hit = idx.eq(static_cast<std::int64_t>(e)).nonzero();  // [n, 2]: (row, slot)
      if (hit.size(0) == 0) continue;
      used[e] = true;
      auto rows = hit.select(1, 0), slots = hit.select(1, 1);
      auto y = experts[e].forward(h.index_select(0, rows));
      auto we = w.index({rows, slots}).unsqueeze(1);
      out = out.index_add(0, rows, we * y);
    }
    return out;
  }
  void step() {
    for (std::size_t e = 0; e < experts.size(); ++e) {
      if (used[e]) opts[e]->step();
      opts[e]->zero_grad();
      used[e] = false;
    }
  }
};

struct Trunk {
  torch::nn::Linear in{784, kWidth}, out{kWidth, 10};
};

struct RunResult {
  double accuracy = 0, train_seconds = 0;
  MoeStats stats;
};

double evaluate(const std::function<torch::Tensor(const torch::Tensor&)>& model,
                const optim::FashionData& test) {
  torch::NoGradGuard ng;
  double correct = 0;
  for (std::size_t b = 0; b < test.size(); b += 1000) {
    auto [x, y] = test.range(b, std::min(test.size(), b + 1000));
    correct += model(x).argmax(1).eq(y).sum().item<double>();
  }
  return correct / static_cast<double>(test.size());
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 1200;
  std::size_t batch = 64;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--steps") steps = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--batch") batch = static_cast<std::size_t>(std::atoi(argv[i + 1]));
  }
  torch::set_num_threads(1);
  auto train_set =
      training::load_fashion_mnist(training::kFashionMnistDefaultDir, training::Split::train);
  auto test_set =
      training::load_fashion_mnist(training::kFashionMnistDefaultDir, training::Split::test);
  if (!train_set || !test_set) {
    std::fprintf(stderr, "Fashion-MNIST: %s\n",
                 (!train_set ? train_set.error() : test_set.error()).message().c_str());
    return 1;
  }
  optim::FashionData train(train_set.value()), test(test_set.value());
  std::vector<std::vector<std::uint32_t>> batches(static_cast<std::size_t>(steps));
  {
    std::mt19937 rng(5);
    std::uniform_int_distribution<std::uint32_t> pick(0,
                                                      static_cast<std::uint32_t>(train.size() - 1));
    for (auto& b : batches) {
      b.resize(batch);
      for (auto& i : b) i = pick(rng);
    }
  }
  torch::manual_seed(7);
  Trunk init;
  torch::nn::Linear init_proj(kWidth, 2 * kGrid);
  auto copy_trunk = [&](Trunk& t, torch::nn::Linear& proj) {
    torch::NoGradGuard ng;
    t.in->weight.copy_(init.in->weight);
    t.in->bias.copy_(init.in->bias);
    t.out->weight.copy_(init.out->weight);
    t.out->bias.copy_(init.out->bias);
    proj->weight.copy_(init_proj->weight);
    proj->bias.copy_(init_proj->bias);
  };
  auto trunk_params = [](Trunk& t, torch::nn::Linear& proj) {
    std::vector<torch::Tensor> p;
    for (auto* m : {&t.in, &t.out, &proj})
      for (auto& x : (*m)->parameters()) p.push_back(x);
    return p;
  };
  nlohmann::json out;

  // The anchor.
  RunResult local;
  {
    Trunk t;
    LocalMoe moe;
    copy_trunk(t, moe.proj);
    torch::optim::Adam opt(trunk_params(t, moe.proj), torch::optim::AdamOptions(kLr));
    auto model = [&](const torch::Tensor& x) {
      auto h = torch::relu(t.in->forward(x.reshape({x.size(0), 784})));
      return t.out->forward(torch::relu(h + moe.forward(h)));
    };
    const auto t0 = Clock::now();
    for (const auto& b : batches) {
      auto [x, y] = train.batch(b);
      opt.zero_grad();
      torch::nn::functional::cross_entropy(model(x), y).backward();
      opt.step();
      moe.step();
    }
    local.train_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    local.accuracy = evaluate(model, test);
    std::printf("local        accuracy %.4f  train %.1f s  (%d steps of %zu)\n", local.accuracy,
                local.train_seconds, steps, batch);
    out["local"] = {{"accuracy", local.accuracy}, {"train_seconds", local.train_seconds}};
  }

  IoThread io("bench-moe-conv-io");
  auto start_host = [&] { return bench::start_host_or_exit(io); };
  auto client = start_host();
  struct Variant {
    const char* name;
    double fail_rate;
    bool kill;
    std::uint64_t step_samples = 0;
  };
  for (const Variant v : {Variant{"remote", 0, false}, Variant{"remote-fail", 0.1, false},
                          Variant{"remote-kill", 0, true}, Variant{"remote-swarm", 0, false, 64}}) {
    auto directory = std::make_shared<averaging::MemoryDirectory>();
    std::vector<std::shared_ptr<net::Host>> hosts;
    std::vector<std::shared_ptr<ExpertServer>> servers;
    for (std::int64_t i = 0; i < kGrid; ++i) {
      hosts.push_back(start_host());
      ExpertServerConfig cfg;
      cfg.forward_pool.max_wait = 0ms;
      cfg.backward_pool.max_wait = 0ms;
      cfg.declare_period = 2s;
      cfg.declare_ttl = 4s;
      cfg.inject_failure_rate = v.fail_rate;
      cfg.step_samples = v.step_samples;
      if (v.step_samples > 0) cfg.max_staleness = 1;
      auto s = ExpertServer::create(hosts.back(), directory, cfg);
      for (std::int64_t j = 0; j < kGrid; ++j)
        if (!s->add_expert("ffn." + std::to_string(i) + "." + std::to_string(j),
                           make_ffn_expert(kWidth, kHidden, expert_seed(i, j)), adam_factory(kLr)))
          return 1;
      if (!block_on(
              io.executor(), [s] { return s->start(); }, 10s))
        return 1;
      servers.push_back(s);
    }
    MoeOptions mo;
    mo.grid_size = {kGrid, kGrid};
    mo.in_features = mo.out_features = kWidth;
    mo.k = kK;
    mo.forward_timeout = 5s;
    mo.backward_timeout = 5s;
    mo.timeout_after_k_min = 1s;
    Trunk t;
    RemoteMixtureOfExperts moe(mo, client, std::make_shared<ExpertDirectory>(directory, 2s));
    copy_trunk(t, moe->proj);
    torch::optim::Adam opt(trunk_params(t, moe->proj), torch::optim::AdamOptions(kLr));
    auto model = [&](const torch::Tensor& x) {
      auto h = torch::relu(t.in->forward(x.reshape({x.size(0), 784})));
      return t.out->forward(torch::relu(h + moe->forward(h)));
    };
    RunResult r;
    std::size_t failed_batches = 0;
    const auto t0 = Clock::now();
    for (std::size_t s = 0; s < batches.size(); ++s) {
      if (v.kill && s == batches.size() / 2) {
        auto victim = servers.back();
        (void)block_on(
            io.executor(),
            [victim]() -> awaitable<result<void>> {
              co_await victim->stop();
              co_return success();
            },
            10s);
      }
      auto [x, y] = train.batch(batches[s]);
      opt.zero_grad();
      try {
        torch::nn::functional::cross_entropy(model(x), y).backward();
      } catch (const std::exception& e) {
        ++failed_batches;  // no expert answered any row: the batch is skipped
        continue;
      }
      opt.step();
    }
    r.train_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    r.accuracy = evaluate(model, test);
    r.stats = moe->stats();
    const double fail_share = r.stats.forward_calls
                                  ? static_cast<double>(r.stats.forward_failures) /
                                        static_cast<double>(r.stats.forward_calls)
                                  : 0;
    std::printf(
        "%-12s accuracy %.4f  train %.1f s  | vs local: accuracy %+.2f points, time x%.2f | "
        "forward calls %llu failed %.1f%%, backward calls %llu failed %llu, batches skipped %zu\n",
        v.name, r.accuracy, r.train_seconds, 100 * (r.accuracy - local.accuracy),
        r.train_seconds / local.train_seconds,
        static_cast<unsigned long long>(r.stats.forward_calls), 100 * fail_share,
        static_cast<unsigned long long>(r.stats.backward_calls),
        static_cast<unsigned long long>(r.stats.backward_failures), failed_batches);
    out[v.name] = {{"accuracy", r.accuracy},
                   {"train_seconds", r.train_seconds},
                   {"accuracy_minus_local_points", 100 * (r.accuracy - local.accuracy)},
                   {"time_ratio", r.train_seconds / local.train_seconds},
                   {"forward_calls", r.stats.forward_calls},
                   {"forward_failures", r.stats.forward_failures},
                   {"backward_failures", r.stats.backward_failures},
                   {"batches_skipped", failed_batches}};
    if (v.step_samples > 0) {
      std::uint64_t steps_taken = 0, stale = 0;
      for (auto& sv : servers) {
        steps_taken += sv->stats().optimizer_steps.load();
        stale += sv->stats().stale_gradients.load();
      }
      std::printf("%-12s expert optimizer steps %llu (one per %llu rows), stale gradients %llu\n",
                  v.name, static_cast<unsigned long long>(steps_taken),
                  static_cast<unsigned long long>(v.step_samples),
                  static_cast<unsigned long long>(stale));
      out[v.name]["expert_steps"] = steps_taken;
      out[v.name]["stale_gradients"] = stale;
    }
    (void)block_on(
        io.executor(),
        [&]() -> awaitable<result<void>> {
          for (auto& s : servers) co_await s->stop();
          for (auto& h : hosts) co_await h->stop();
          co_return success();
        },
        30s);
  }
  out["steps"] = steps;
  out["batch"] = batch;
  std::printf("RESULT %s\n", out.dump().c_str());
  (void)block_on(
      io.executor(),
      [&]() -> awaitable<result<void>> {
        co_await client->stop();
        co_return success();
      },
      10s);
  (void)io.stop();
  return 0;
}
