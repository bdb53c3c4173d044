// A DMoE model trained on Fashion-MNIST through two expert servers over loopback: a trainer
// whose model has a RemoteMixtureOfExperts layer (gating + 16 remote FFN experts, k = 4)
// between a local input projection and a local classifier. The loss falls and the held-out
// accuracy beats chance by far; both servers' experts are used and step their optimizers.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "moe/moe_env.hpp"
#include "starling/optim/fashion_task.hpp"
#include "starling/training/fashion_mnist.hpp"

namespace starling::moe {
namespace {

using namespace test;

TEST(MoeTraining, FashionMnistThroughTwoExpertServersLossFalls) {
  auto train =
      training::load_fashion_mnist(training::kFashionMnistDefaultDir, training::Split::train);
  ASSERT_TRUE(train) << train.error().message();
  auto held =
      training::load_fashion_mnist(training::kFashionMnistDefaultDir, training::Split::test);
  ASSERT_TRUE(held) << held.error().message();
  optim::FashionData data(train.value()), test_data(held.value());

  constexpr std::int64_t kWidth = 64;
  Env env;
  auto a = env.serve(0, "ffn.[0:2].[0:4]", Duration::zero(), kWidth, 128, adam_factory(1e-3));
  auto b = env.serve(1, "ffn.[2:4].[0:4]", Duration::zero(), kWidth, 128, adam_factory(1e-3));
  auto dir = env.directory(2, 5s);

  MoeOptions o;
  o.grid_size = {4, 4};
  o.in_features = kWidth;
  o.out_features = kWidth;
  o.k = 4;
  o.forward_timeout = 10s;
  o.timeout_after_k_min = 2s;
  torch::manual_seed(1);
  torch::nn::Linear in(784, kWidth), out(kWidth, 10);
  RemoteMixtureOfExperts moe(o, env.cluster->host_ptr(2), dir);
  std::vector<torch::Tensor> params;
  for (auto& p : in->parameters()) params.push_back(p);
  for (auto& p : out->parameters()) params.push_back(p);
  for (auto& p : moe->parameters()) params.push_back(p);
  torch::optim::Adam opt(params, torch::optim::AdamOptions(1e-3));
  auto model = [&](const torch::Tensor& x) {
    auto h = torch::relu(in->forward(x.reshape({x.size(0), 784})));
    return out->forward(torch::relu(h + moe->forward(h)));
  };

  std::mt19937 rng(3);
  std::uniform_int_distribution<std::uint32_t> pick(0, static_cast<std::uint32_t>(data.size() - 1));
  constexpr int kSteps = 200;
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::uint32_t> idx(64);
    for (auto& i : idx) i = pick(rng);
    auto [x, y] = data.batch(idx);
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model(x), y);
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  const double first = std::accumulate(losses.begin(), losses.begin() + 20, 0.0) / 20;
  const double last = std::accumulate(losses.end() - 20, losses.end(), 0.0) / 20;
  torch::NoGradGuard ng;
  auto [tx, ty] = test_data.range(0, 1000);
  const double acc = model(tx).argmax(1).eq(ty).to(torch::kFloat64).mean().item<double>();
  std::printf(
      "DMoE Fashion-MNIST: loss %.3f -> %.3f over %d steps of 64; held-out accuracy %.3f "
      "(1000 samples); server steps %llu / %llu; failures %llu\n",
      first, last, kSteps, acc, static_cast<unsigned long long>(a->stats().optimizer_steps.load()),
      static_cast<unsigned long long>(b->stats().optimizer_steps.load()),
      static_cast<unsigned long long>(moe->stats().forward_failures));
  EXPECT_LT(last, 0.6 * first);
  EXPECT_GT(acc, 0.7);
  EXPECT_GT(a->stats().optimizer_steps.load(), 0u);
  EXPECT_GT(b->stats().optimizer_steps.load(), 0u);
  EXPECT_EQ(moe->stats().forward_failures, 0u);
  env.stop(b);
  env.stop(a);
}

}  // namespace
}  // namespace starling::moe
