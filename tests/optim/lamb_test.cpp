// LAMB against the update rule computed by hand in doubles (bias correction, weight decay,
// trust ratio with and without its clip, global gradient clipping), the epoch-driven schedule,
// and its state carried by the training-state format.
#include <gtest/gtest.h>

#include <cmath>

#include "starling/optim/lamb.hpp"
#include "starling/optim/training_state.hpp"

using namespace starling;
using namespace starling::optim;

namespace {

struct Reference {
  std::vector<double> w, m, v;
  int t = 0;
  // One LAMB step on w with gradient g (already clipped).
  void step(const std::vector<double>& g, double lr, double b1, double b2, double eps, double wd,
            double clip) {
    ++t;
    std::vector<double> r(w.size());
    double wn = 0, rn = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
      r[i] = mh / (std::sqrt(vh) + eps) + wd * w[i];
      wn += w[i] * w[i];
      rn += r[i] * r[i];
    }
    wn = std::min(std::sqrt(wn), clip);
    rn = std::sqrt(rn);
    const double trust = (wn > 0 && rn > 0) ? wn / rn : 1.0;
    for (std::size_t i = 0; i < w.size(); ++i) w[i] -= lr * trust * r[i];
  }
};

torch::Tensor tensor(const std::vector<double>& v) {
  return torch::tensor(std::vector<float>(v.begin(), v.end()));
}

void expect_near(const torch::Tensor& t, const std::vector<double>& v, double tol = 1e-5) {
  ASSERT_EQ(t.numel(), static_cast<std::int64_t>(v.size()));
  auto a = t.to(torch::kDouble).contiguous();
  for (std::size_t i = 0; i < v.size(); ++i)
    EXPECT_NEAR(a.data_ptr<double>()[i], v[i], tol * std::max(1.0, std::abs(v[i]))) << i;
}

}  // namespace

TEST(Lamb, MatchesTheUpdateRuleComputedByHand) {
  LambConfig c;
  c.lr = 0.01;
  c.weight_decay = 0.1;
  c.trust_clip = 10;
  // Two parameters: a small one (trust ratio |w|/|r|) and a large one (|w| > trust_clip).
  Reference ra{{0.5, -0.25, 0.125}, {0, 0, 0}, {0, 0, 0}};
  Reference rb{{8, -9, 7, 6}, {0, 0, 0, 0}, {0, 0, 0, 0}};
  auto a = tensor(ra.w).requires_grad_(true);
  auto b = tensor(rb.w).requires_grad_(true);
  Lamb opt({a, b}, c);
  const std::vector<std::vector<double>> ga{{0.1, 0.2, -0.3}, {-0.05, 0.4, 0.2}, {0.3, 0.3, 0.3}};
  const std::vector<std::vector<double>> gb{{1, -2, 0.5, 0}, {0.2, 0.1, -0.1, 3}, {0, 0, 1, 1}};
  for (std::size_t s = 0; s < ga.size(); ++s) {
    a.mutable_grad() = tensor(ga[s]);
    b.mutable_grad() = tensor(gb[s]);
    opt.step();
    ra.step(ga[s], c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.trust_clip);
    rb.step(gb[s], c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.trust_clip);
    expect_near(a.detach(), ra.w);
    expect_near(b.detach(), rb.w);
  }
  // The clip mattered for b: |w| ~ 15 > 10 (a step without it would be 1.5x larger).
  EXPECT_GT(std::sqrt(8 * 8 + 9 * 9 + 7 * 7 + 6 * 6), c.trust_clip);
}

TEST(Lamb, ClipsTheGlobalGradientNorm) {
  LambConfig c;
  c.lr = 0.1;
  c.weight_decay = 0;
  c.max_grad_norm = 1.0;
  Reference r{{1, 2}, {0, 0}, {0, 0}};
  auto w = tensor(r.w).requires_grad_(true);
  Lamb opt({w}, c);
  w.mutable_grad() = tensor({3, 4});  // norm 5 -> scaled to 1
  opt.step();
  EXPECT_NEAR(opt.last_grad_norm(), 5.0, 1e-6);
  const double s = 1.0 / (5.0 + 1e-6);
  r.step({3 * s, 4 * s}, c.lr, c.beta1, c.beta2, c.eps, 0, c.trust_clip);
  expect_near(w.detach(), r.w);
}

TEST(Lamb, ZeroWeightsUseATrustRatioOfOne) {
  LambConfig c;
  c.lr = 0.1;
  c.weight_decay = 0;
  Reference r{{0, 0}, {0, 0}, {0, 0}};
  auto w = tensor(r.w).requires_grad_(true);
  Lamb opt({w}, c);
  w.mutable_grad() = tensor({1, -1});
  opt.step();
  r.step({1, -1}, c.lr, c.beta1, c.beta2, c.eps, 0, c.trust_clip);
  expect_near(w.detach(), r.w);
  EXPECT_NEAR(w[0].item<double>(), -0.1, 1e-4);  // adam direction of size ~1, times lr
}

TEST(Lamb, ScheduleFollowsTheEpoch) {
  training::LrSchedule s{1e-2, 10, 110, 0.1};
  EXPECT_DOUBLE_EQ(training::lr_at(s, 0), 1e-3);
  EXPECT_DOUBLE_EQ(training::lr_at(s, 9), 1e-2);
  EXPECT_DOUBLE_EQ(training::lr_at(s, 10), 1e-2);
  EXPECT_NEAR(training::lr_at(s, 60), 1e-2 * (0.1 + 0.9 * 0.5), 1e-12);
  EXPECT_DOUBLE_EQ(training::lr_at(s, 110), 1e-3);
  EXPECT_DOUBLE_EQ(training::lr_at(s, 5000), 1e-3);
  EXPECT_DOUBLE_EQ(training::lr_at({1e-2, 0, 0, 0.1}, 7), 1e-2);

  LambConfig c;
  c.schedule = s;
  auto w = torch::ones({3}).requires_grad_(true);
  Lamb opt({w}, c);
  opt.set_epoch(4);
  EXPECT_DOUBLE_EQ(opt.current_lr(), 5e-3);
  w.mutable_grad() = torch::ones({3});
  opt.step();
  // The group's rate is the scheduled one (and the state format carries it).
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 5e-3);
}

TEST(Lamb, StateTravelsInTheTrainingStateFormat) {
  auto model = torch::nn::Linear(4, 2);
  LambConfig c;
  Lamb opt(model->parameters(), c);
  auto out = model->forward(torch::ones({3, 4})).sum();
  out.backward();
  opt.step();
  auto bytes = save_training_state(*model, &opt);
  ASSERT_TRUE(bytes) << bytes.error().message();
  auto other = torch::nn::Linear(4, 2);
  Lamb opt2(other->parameters(), c);
  ASSERT_TRUE(load_training_state(bytes.value(), *other, &opt2));
  EXPECT_TRUE(torch::equal(other->weight, model->weight));
  // The same next step from the same state.
  for (auto* o : {&opt, &opt2}) {
    for (auto& p : o->param_groups()[0].params()) p.mutable_grad() = torch::ones_like(p);
    o->step();
  }
  EXPECT_TRUE(torch::equal(other->weight, model->weight));
}
