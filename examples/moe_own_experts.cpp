// Serving your own experts (docs/moe.md): an ExpertServer hosting four user-defined torch
// modules (a LayerNorm + MLP block with a residual) on a grid `block.[0:2].[0:2]`, declared in
// a directory, and a trainer in the same process whose RemoteMixtureOfExperts finds them by
// beam search and trains through them over loopback on a toy regression (y = sin(x) per
// feature). Real deployments put the server in its own process on a DHT node
// (averaging::DhtDirectory, or `starling experts serve` for the built-in experts); the calls
// are the same. Prints the loss as it falls and each expert's share of the rows.
//
//   example_moe_own_experts [--steps N]
#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/torch.h>

#include "starling/core/blocking.hpp"
#include "starling/moe/expert_server.hpp"
#include "starling/moe/remote.hpp"

using namespace starling;

namespace {

constexpr std::int64_t kWidth = 32;

// The user's expert: any torch module mapping [N, 32] -> [N, 32].
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})))),
        up(register_module("up", torch::nn::Linear(kWidth, 4 * kWidth))),
        down(register_module("down", torch::nn::Linear(4 * kWidth, kWidth))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return x + down->forward(torch::gelu(up->forward(norm->forward(x))));
  }
  torch::nn::LayerNorm norm;
  torch::nn::Linear up, down;
};
TORCH_MODULE(Block);

}  // namespace

int main(int argc, char** argv) {
  int steps = 300;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--steps") steps = std::atoi(argv[i + 1]);
  torch::set_num_threads(1);
  torch::manual_seed(1);
  IoThread io("example-moe-io");
  auto start_host = [&] {
    auto h = net::Host::create(io.executor(), crypto::KeyPair::generate(), net::HostConfig{});
    auto r = block_on(
        io.executor(), [h] { return h->start(); }, 10s);
    if (!r) {
      std::fprintf(stderr, "host: %s\n", r.error().message().c_str());
      std::exit(1);
    }
    return h;
  };
  auto server_host = start_host();
  auto trainer_host = start_host();
  auto directory = std::make_shared<averaging::MemoryDirectory>();

  // The server: four Blocks, each with its own Adam.
  auto server = moe::ExpertServer::create(server_host, directory, moe::ExpertServerConfig{});
  auto uids = moe::expand_pattern("block.[0:2].[0:2]");
  for (const auto& u : uids.value()) {
    Block block;
    moe::ExpertModule m;
    m.parameters = block.ptr();
    m.forward = [block](const torch::Tensor& x) mutable { return block->forward(x); };
    m.input_shape = {kWidth};
    m.output_shape = {kWidth};
    m.type = "block";
    if (auto r = server->add_expert(u.to_string(), std::move(m), moe::adam_factory(1e-3)); !r) {
      std::fprintf(stderr, "add_expert: %s\n", r.error().message().c_str());
      return 1;
    }
  }
  if (auto r = block_on(
          io.executor(), [server] { return server->start(); }, 10s);
      !r) {
    std::fprintf(stderr, "server: %s\n", r.error().message().c_str());
    return 1;
  }

  // The trainer: gating + 2 of the 4 experts per sample.
  moe::MoeOptions o;
  o.grid = "block";
  o.grid_size = {2, 2};
  o.in_features = o.out_features = kWidth;
  o.k = 2;
  moe::RemoteMixtureOfExperts layer(o, trainer_host,
                                    std::make_shared<moe::ExpertDirectory>(directory, 2s));
  torch::optim::Adam opt(layer->parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 1; step <= steps; ++step) {
    auto x = torch::randn({64, kWidth});
    opt.zero_grad();
    auto loss = torch::mse_loss(layer->forward(x), torch::sin(x));
    loss.backward();
    opt.step();
    if (step == 1 || step % 50 == 0)
      std::printf("step %4d  loss %.4f\n", step, loss.item<double>());
  }
  const auto st = layer->stats();
  std::uint64_t rows = 0;
  for (const auto& [uid, n] : st.rows_per_expert) rows += n;
  for (const auto& [uid, n] : st.rows_per_expert)
    std::printf("%s: %.1f%% of the rows\n", uid.c_str(),
                100.0 * static_cast<double>(n) / static_cast<double>(rows));
  std::printf("forward calls %llu (failed %llu), server optimizer steps %llu\n",
              static_cast<unsigned long long>(st.forward_calls),
              static_cast<unsigned long long>(st.forward_failures),
              static_cast<unsigned long long>(server->stats().optimizer_steps.load()));
  (void)block_on(
      io.executor(),
      [&]() -> awaitable<result<void>> {
        co_await server->stop();
        co_await trainer_host->stop();
        co_await server_host->stop();
        co_return success();
      },
      20s);
  (void)io.stop();
  return 0;
}
