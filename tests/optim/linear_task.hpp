// A tiny regression task for optimizer tests: Linear(4, 1) from a seed, synthetic batches
// y = x . w* + 0.5 plus noise, and the flattened parameters (for equality checks); plus the
// checks shared by the multi-peer scenarios (over the test hub and over the real network).
#pragma once

#include <gtest/gtest.h>
#include <torch/nn.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "starling/core/async.hpp"

namespace starling::test {

inline torch::nn::Linear make_linear(int seed) {
  torch::manual_seed(seed);
  return torch::nn::Linear(4, 1);
}

inline std::pair<torch::Tensor, torch::Tensor> batch(torch::Generator& gen, int n) {
  auto x = torch::randn({n, 4}, gen);
  auto w = torch::tensor({{1.0f}, {-2.0f}, {0.5f}, {3.0f}});
  auto y = x.matmul(w) + 0.5 + 0.01 * torch::randn({n, 1}, gen);
  return {x, y};
}

inline torch::Tensor flat_params(torch::nn::Module& m) {
  std::vector<torch::Tensor> v;
  for (auto& p : m.parameters()) v.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(v);
}

// Polls `pred` until it holds or `limit` passes (for conditions set by training threads).
inline bool wait_until(const std::function<bool()>& pred, Duration limit) {
  auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// The lowest epoch among the peers still training (a Peer has atomics `stop` and `epoch`).
template <class Peers>
std::uint64_t min_live_epoch(const Peers& peers) {
  std::uint64_t e = UINT64_MAX;
  for (auto& p : peers)
    if (!p->stop) e = std::min<std::uint64_t>(e, p->epoch);
  return e;
}

// Every epoch recorded by more than one peer holds identical parameters on all of them, and at
// least `min_epochs_checked` epochs were recorded by several peers.
inline void expect_agreement(const std::map<std::uint64_t, std::vector<torch::Tensor>>& record,
                             std::size_t min_epochs_checked) {
  std::size_t checked = 0;
  for (const auto& [epoch, v] : record) {
    if (v.size() < 2) continue;
    ++checked;
    for (std::size_t i = 1; i < v.size(); ++i)
      EXPECT_TRUE(torch::equal(v[0], v[i])) << "epoch " << epoch << " peer " << i;
  }
  EXPECT_GE(checked, min_epochs_checked);
}

}  // namespace starling::test
