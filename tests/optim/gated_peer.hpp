// A peer with delayed updates (OptimizerOptions::delay_optimizer_step) over a gated test
// double, for the delayed-update tests: its rounds run when the test opens the gate; every
// batch fed and the parameters its gradient was taken at are recorded.
#pragma once

#include <gtest/gtest.h>

#include <torch/nn.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <atomic>
#include <functional>

#include "optim/fake_collaboration.hpp"
#include "optim/hub_peer.hpp"
#include "optim/linear_task.hpp"
#include "starling/optim/optimizer.hpp"

namespace starling::test {

using namespace starling::optim;
using namespace starling::training;

// A collaboration whose rounds wait until the test opens the gate; a round then "averages"
// with one imaginary partner of the same weight holding the same values (the output gets the
// input) or `partner_values` if set, or fails if the test asked for failures.
class GatedCollaboration : public FakeCollaboration {
 public:
  GatedCollaboration(std::shared_ptr<Hub> hub, asio::any_io_executor ex)
      : FakeCollaboration(std::move(hub), ex), gate_(ex) {}

  void open() {
    asio::post(executor(), [this] { gate_.set(); });
  }
  std::atomic<int> started{0}, finished{0}, failures_to_inject{0};
  std::atomic<double> last_weight{0};  // of the last round started
  std::vector<float> partner_values;   // set before the first round

  awaitable<result<RoundResult>> average(RoundData data, RoundOptions options) override {
    last_weight = options.weight;
    ++started;
    auto waited = co_await with_timeout(
        gate_.wait(), std::max<Duration>(options.deadline - Clock::now(), 1ms), "gate");
    ++finished;
    if (!waited) co_return waited.error();
    if (failures_to_inject > 0) {
      --failures_to_inject;
      co_return make_error(errc::unavailable, "injected failure");
    }
    if (partner_values.empty())
      std::copy(data.input.begin(), data.input.end(), data.output.begin());
    else
      for (std::size_t i = 0; i < data.input.size(); ++i)
        data.output[i] = (data.input[i] + partner_values.at(i)) / 2;
    RoundResult r;
    r.members.push_back({self(), options.weight});
    r.members.push_back({partner_, options.weight});
    r.total_weight = 2 * options.weight;
    co_return r;
  }

 private:
  AsyncEvent gate_;
  net::PeerId partner_ = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
};

inline OptimizerOptions delayed_options(DelayCorrection correction = DelayCorrection::none) {
  OptimizerOptions o = hub_options("delayed", 64, 8);
  o.delay_optimizer_step = true;
  o.delay_correction = correction;
  o.averaging_timeout = 60s;
  o.progress.max_refresh = 200ms;
  o.progress.stale_after = 600s;  // the partner's record below never goes stale
  o.progress_ttl = 600s;
  return o;
}

// One peer over a GatedCollaboration, with a partner's progress record in the hub so that it
// averages rather than stepping alone.
struct GatedPeer {
  using MakeInner = std::function<std::unique_ptr<torch::optim::Optimizer>(torch::nn::Linear&)>;
  static std::unique_ptr<torch::optim::Optimizer> sgd(torch::nn::Linear& m) {
    return std::make_unique<torch::optim::SGD>(m->parameters(), 0.05);
  }

  std::shared_ptr<Hub> hub = std::make_shared<Hub>();
  IoThread io;
  std::shared_ptr<GatedCollaboration> collab;
  torch::nn::Linear model = make_linear(1);
  std::unique_ptr<Optimizer> opt;
  torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(11);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;  // every batch fed
  std::vector<torch::Tensor> params_at;  // the parameters each batch's gradient was taken at

  explicit GatedPeer(DelayCorrection correction = DelayCorrection::none,
                     const std::filesystem::path& checkpoint_dir = {},
                     const MakeInner& make_inner = sgd,
                     const std::function<void(OptimizerOptions&)>& tweak = {}) {
    enable_clock_jumps();  // some tests move the clock past backoffs and expiries
    collab = std::make_shared<GatedCollaboration>(hub, io.executor());
    PeerProgress partner;
    partner.epoch = 0;
    partner.seq = 1;
    partner.ttl = 600s;
    {
      std::lock_guard lk(hub->mu);
      auto id = net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
      hub->records[id] = {encode_progress(partner), {Clock::now(), 600s}};
    }
    auto o = delayed_options(correction);
    o.checkpoint_dir = checkpoint_dir;
    if (tweak) tweak(o);
    opt = Optimizer::create(*model, make_inner(model), o, collab).value();
  }
  bool knows_partner() {  // and has settled its view (no round before: ProgressTracker)
    const auto v = opt->status().collaboration;
    return v.num_peers == 2 && v.settled;
  }
  // Feeds until the step of epoch 0 is applied and the round of epoch 1 (the backlog) has
  // started; returns the batches fed by then, for each (0: not within 30 s).
  std::pair<std::size_t, std::size_t> feed_until_second_round() {
    std::size_t first_applied = 0, second_launch = 0;
    const auto until = Clock::now() + 30s;
    while (second_launch == 0 && Clock::now() < until) {
      auto r = feed();
      if (r.stepped && first_applied == 0) first_applied = batches.size();
      if (r.round_in_background && opt->local_epoch() == 1) second_launch = batches.size();
    }
    return {first_applied, second_launch};
  }
  StepReport feed() {
    auto [x, y] = batch(gen, 8);
    batches.emplace_back(x, y);
    params_at.push_back(flat_params(*model));
    torch::mse_loss(model->forward(x), y).backward();
    auto r = opt->step();
    EXPECT_TRUE(r);
    return r ? r.value() : StepReport{};
  }
};

// The parameters after one SGD step (lr 0.05) from make_linear(1) on the mean gradient of
// batches [0, n).
inline torch::Tensor reference_step(const std::vector<std::pair<torch::Tensor, torch::Tensor>>& b,
                                    std::size_t n) {
  auto ref = make_linear(1);
  torch::optim::SGD sgd(ref->parameters(), 0.05);
  std::vector<torch::Tensor> xs, ys;
  for (std::size_t i = 0; i < n; ++i) {
    xs.push_back(b[i].first);
    ys.push_back(b[i].second);
  }
  torch::mse_loss(ref->forward(torch::cat(xs)), torch::cat(ys)).backward();
  sgd.step();
  return flat_params(*ref);
}

// The mean over batches [from, to) of each batch's gradient, taken at the parameters the
// peer held when it computed that batch (all batches have the same size).
inline torch::Tensor mean_gradient(const GatedPeer& p, std::size_t from, std::size_t to) {
  torch::Tensor sum;
  for (std::size_t i = from; i < to; ++i) {
    auto m = make_linear(1);
    {
      torch::NoGradGuard no_grad;
      m->weight.copy_(p.params_at[i].narrow(0, 0, 4).view({1, 4}));
      m->bias.copy_(p.params_at[i].narrow(0, 4, 1));
    }
    torch::mse_loss(m->forward(p.batches[i].first), p.batches[i].second).backward();
    auto g = torch::cat({m->weight.grad().reshape({-1}), m->bias.grad().reshape({-1})});
    sum = sum.defined() ? sum + g : g;
  }
  return sum / static_cast<double>(to - from);
}

inline std::uint64_t digest_of(const torch::Tensor& flat) {
  StateDigest d;
  auto t = flat.contiguous();
  d.update(t.data_ptr<float>(), static_cast<std::size_t>(t.numel()) * sizeof(float));
  return d.value();
}

}  // namespace starling::test
