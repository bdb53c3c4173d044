// The gradient check's re-computation (optim/grad_check.hpp): a validator re-computes a
// trainer's contribution from its public samples and compares; honest trainers pass, every
// attack (label flip, sign flip, noise, ALIE, inflated sample counts, stale parameters,
// someone else's samples) fails, with a wide margin between the two.
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <random>

#include "starling/crypto/keys.hpp"
#include "starling/optim/fashion_task.hpp"
#include "starling/optim/grad_check.hpp"
#include "starling/training/public_samples.hpp"

namespace starling::optim {
namespace {

constexpr std::uint64_t kEpoch = 3;
const std::string kRun = "grad-check-run";

training::ImageDataset synthetic(std::size_t n, bool flip = false) {
  training::ImageDataset d;
  d.rows = d.cols = 28;
  std::mt19937 rng(7);
  d.pixels.resize(n * 784);
  for (auto& p : d.pixels) p = static_cast<std::uint8_t>(rng() & 0xFF);
  d.labels.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    unsigned s = 0;
    for (int j = 0; j < 28; ++j) s += d.pixels[i * 784 + j];
    const auto l = static_cast<std::uint8_t>(s % 10);
    d.labels[i] = flip ? static_cast<std::uint8_t>(9 - l) : l;
  }
  return d;
}

torch::Tensor flat_grads(torch::nn::Module& m) {
  std::vector<torch::Tensor> v;
  for (auto& p : m.parameters())
    v.push_back(p.grad().defined() ? p.grad().detach().reshape({-1}).clone()
                                   : torch::zeros({p.numel()}));
  return torch::cat(v);
}

// A trainer as starling train --grad-check runs it: public batches of `batch` from position 0
// of (run, peer, epoch), each gradient accumulated x its size (Optimizer::Impl::accumulate),
// the contribution the mean. Also the per-batch gradients' standard deviation (for ALIE).
struct Trained {
  torch::Tensor contribution, batch_sd;
  std::uint64_t samples = 0;
};
Trained train(FashionTask& t, const std::string& peer, std::size_t steps, std::size_t batch) {
  const training::PublicSamples stream(kRun, peer, t.dataset_size());
  std::vector<torch::Tensor> per_batch;
  torch::Tensor acc;
  Trained out;
  for (std::size_t k = 0; k < steps; ++k) {
    std::vector<std::uint32_t> idx;
    stream.indices(kEpoch, out.samples, batch, idx);
    t.forward_backward(idx);
    auto g = flat_grads(*t.model());
    per_batch.push_back(g);
    acc = acc.defined() ? acc + g * static_cast<double>(batch) : g * static_cast<double>(batch);
    for (auto& p : t.model()->parameters()) p.mutable_grad().zero_();
    out.samples += batch;
  }
  out.contribution = acc / static_cast<double>(out.samples);
  out.batch_sd = torch::stack(per_batch).std(0);
  return out;
}

training::ContributionSample sample_of(const std::string& peer, const torch::Tensor& values,
                                       double weight) {
  training::ContributionSample s;
  s.peer = net::PeerId::from_string(peer).value();
  s.weight = weight;
  s.median_weight = weight;
  auto v = values.contiguous();
  const float* p = v.data_ptr<float>();
  // Two parts this validator owns: a piece of the first layer and the output layer's weights.
  for (auto [off, n] : {std::pair<std::int64_t, std::int64_t>{1000, 4000}, {200960, 2560}})
    s.slices.push_back({static_cast<std::uint64_t>(off), std::vector<float>(p + off, p + off + n)});
  return s;
}

std::string peer_named(std::uint8_t b) {
  Bytes seed(32, b);
  return net::PeerId::from_public_key(crypto::KeyPair::from_seed(seed).value().public_key())
      .to_string();
}
const std::string kPeerA = peer_named(1);
const std::string kPeerB = peer_named(2);

struct GradCheckFixture : ::testing::Test {
  training::ImageDataset data = synthetic(3000);
  FashionTask validator{data, FashionModel::mlp, 11, 0};
  GradientChecker checker{
      *validator.model(),
      [this](const std::vector<std::uint32_t>& i) { return validator.batch_loss(i); }, kRun,
      data.size(), GradCheckConfig{1e-3, 32, 50}};
  double error_of(const training::ContributionSample& s) {
    auto re = checker.recompute(s.peer.to_string(), kEpoch, static_cast<std::uint64_t>(s.weight));
    return GradientChecker::relative_error(s, re);
  }
};

TEST_F(GradCheckFixture, HonestTrainersPassAndEveryAttackFails) {
  // Honest: other batch sizes and thread counts than the validator's.
  double honest_max = 0;
  for (auto [batch, threads] : {std::pair<std::size_t, int>{64, 1}, {32, 2}, {100, 1}}) {
    torch::set_num_threads(threads);
    FashionTask trainer(data, FashionModel::mlp, 11, 0);
    auto t = train(trainer, kPeerA, 6, batch);
    auto s = sample_of(kPeerA, t.contribution, static_cast<double>(t.samples));
    const double e = error_of(s);
    std::cout << "honest (batch " << batch << ", " << threads << " threads): " << e << "\n";
    honest_max = std::max(honest_max, e);
    EXPECT_FALSE(checker.check(s, kEpoch).has_value());
  }
  torch::set_num_threads(1);
  EXPECT_LT(honest_max, 1e-5);

  FashionTask trainer(data, FashionModel::mlp, 11, 0);
  auto t = train(trainer, kPeerA, 6, 64);
  const double w = static_cast<double>(t.samples);
  auto flipped_data = synthetic(3000, true);
  FashionTask flipper(flipped_data, FashionModel::mlp, 11, 0);
  auto f = train(flipper, kPeerA, 6, 64);
  FashionTask half(data, FashionModel::mlp, 11, 0);
  auto h = train(half, kPeerA, 3, 64);  // declares 6 batches' samples, computed 3
  FashionTask other(data, FashionModel::mlp, 11, 0);
  auto o = train(other, kPeerB, 6, 64);  // another peer's samples
  FashionTask stale(data, FashionModel::mlp, 11, 0);
  {
    torch::NoGradGuard ng;  // one Adam-sized step (lr 1e-3) behind the validator's parameters
    for (auto& p : stale.model()->parameters()) p.add_(torch::randn_like(p).sign() * 1e-3);
  }
  auto st = train(stale, kPeerA, 6, 64);
  const std::vector<std::pair<const char*, training::ContributionSample>> attacks = {
      {"label-flip", sample_of(kPeerA, f.contribution, w)},
      {"sign-flip", sample_of(kPeerA, -10 * t.contribution, w)},
      {"random",
       sample_of(kPeerA,
                 torch::randn_like(t.contribution) * 100 * t.contribution.pow(2).mean().sqrt(), w)},
      {"alie", sample_of(kPeerA, t.contribution - t.batch_sd, w)},
      {"inflated samples", sample_of(kPeerA, h.contribution, w)},
      {"stale", sample_of(kPeerA, st.contribution, w)},
      {"another peer's samples", sample_of(kPeerA, o.contribution, w)},
  };
  double attack_min = 1e9;
  for (const auto& [name, s] : attacks) {
    const double e = error_of(s);
    std::cout << name << ": " << e << "\n";
    attack_min = std::min(attack_min, e);
    EXPECT_TRUE(checker.check(s, kEpoch).has_value()) << name;
  }
  EXPECT_GT(attack_min, 100 * std::max(honest_max, 1e-7));
}

// The re-computation's cost against the anchor of training on the same samples (printed, not
// asserted: a wall-clock ratio).
TEST_F(GradCheckFixture, ReComputingCostsAboutWhatTrainingDid) {
  torch::set_num_threads(1);
  FashionTask trainer(data, FashionModel::mlp, 11, 0);
  const training::PublicSamples stream(kRun, kPeerA, data.size());
  constexpr std::uint64_t kSamples = 1024, kBatch = 64;
  std::vector<std::uint32_t> idx;
  // The anchor: the trainer's own work on those samples (forward, backward, .grad cleared).
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t first = 0; first < kSamples; first += kBatch) {
    idx.clear();
    stream.indices(kEpoch, first, kBatch, idx);
    trainer.forward_backward(idx);
    for (auto& p : trainer.model()->parameters()) p.mutable_grad().zero_();
  }
  const auto t1 = std::chrono::steady_clock::now();
  auto re = checker.recompute(kPeerA, kEpoch, kSamples);
  const auto t2 = std::chrono::steady_clock::now();
  const double train_s = std::chrono::duration<double>(t1 - t0).count();
  const double check_s = std::chrono::duration<double>(t2 - t1).count();
  std::cout << "training " << kSamples << " samples: " << train_s
            << " s, re-computing them: " << check_s << " s (x" << check_s / train_s << ")\n";
  EXPECT_EQ(re.size(0), flat_grads(*trainer.model()).size(0));
}

// Far above the median: not re-computed and no verdict (honest counts vary widely); not a
// sample count: a verdict.
TEST_F(GradCheckFixture, ClaimsFarAboveTheMedianAreSkippedNotConvicted) {
  training::ContributionSample s;
  s.peer = net::PeerId::from_string(kPeerA).value();
  s.weight = 40000;
  s.median_weight = 1000;
  s.slices.push_back({0, std::vector<float>(10, 1.0f)});
  EXPECT_FALSE(checker.check(s, kEpoch).has_value());
  EXPECT_TRUE(std::isnan(checker.last_error()));
  s.weight = 9000;  // 9x the median (seen from an honest peer): re-computed, and these values fail
  EXPECT_TRUE(checker.check(s, kEpoch).has_value());
  EXPECT_FALSE(std::isnan(checker.last_error()));
  s.weight = 10.5;
  s.median_weight = 10;
  EXPECT_TRUE(checker.check(s, kEpoch).has_value());  // not a sample count
}

TEST_F(GradCheckFixture, SlicesOutsideTheVectorFail) {
  FashionTask trainer(data, FashionModel::mlp, 11, 0);
  auto t = train(trainer, kPeerA, 1, 64);
  auto s = sample_of(kPeerA, t.contribution, 64);
  s.slices.push_back({static_cast<std::uint64_t>(t.contribution.numel()) - 2, {0, 0, 0}});
  EXPECT_TRUE(checker.check(s, kEpoch).has_value());
}

}  // namespace
}  // namespace starling::optim
