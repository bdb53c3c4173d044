// The language-model task: shapes, causality, windows, determinism, the loss falling alone,
// and two peers over the Hub double training it with LAMB and holding identical parameters.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "optim/fake_collaboration.hpp"
#include "optim/hub_peer.hpp"
#include "starling/optim/lamb.hpp"
#include "starling/optim/lm_task.hpp"
#include "starling/optim/optimizer.hpp"

using namespace starling;
using namespace starling::optim;

namespace {

LmConfig tiny_config() {
  LmConfig c;
  c.vocab = 32;
  c.width = 32;
  c.layers = 1;
  c.heads = 2;
  c.seq_len = 16;
  return c;
}

// A learnable stream: runs counting up mod 32 from random starts.
std::vector<training::TokenId> counting_tokens(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<training::TokenId> t;
  while (t.size() < n) {
    auto x = static_cast<training::TokenId>(rng() % 32);
    const auto len = 4 + rng() % 12;
    for (std::size_t i = 0; i < len; ++i) t.push_back(static_cast<training::TokenId>((x + i) % 32));
  }
  t.resize(n);
  return t;
}

}  // namespace

TEST(LmTask, ModelShapesAndCausality) {
  auto c = tiny_config();
  auto m = make_lm_model(c, 3);
  auto x = torch::randint(0, c.vocab, {2, c.seq_len}, torch::kInt64);
  auto y = m->forward(x);
  EXPECT_EQ(y.sizes(), (std::vector<std::int64_t>{2, c.seq_len, c.vocab}));
  EXPECT_EQ(m->forward(x.slice(1, 0, 5)).sizes(), (std::vector<std::int64_t>{2, 5, c.vocab}));
  // Changing token 10 changes no logit before position 10.
  auto x2 = x.clone();
  x2.index_put_({0, 10}, (x[0][10].item<std::int64_t>() + 1) % c.vocab);
  auto y2 = m->forward(x2);
  EXPECT_TRUE(torch::allclose(y.slice(1, 0, 10), y2.slice(1, 0, 10)));
  EXPECT_FALSE(torch::allclose(y.slice(1, 10, 11), y2.slice(1, 10, 11)));
  // Same seed, same parameters; the presets parse.
  auto m2 = make_lm_model(c, 3);
  auto pa = m->parameters(), pb = m2->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i]));
  EXPECT_EQ(parse_lm_model("small", 2048).value().layers, 4);
  EXPECT_FALSE(parse_lm_model("huge", 2048));
}

TEST(LmTask, WindowsShiftTargetsByOne) {
  std::vector<training::TokenId> tokens(100);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<training::TokenId>(i);
  LmData d(tokens, 16);
  EXPECT_EQ(d.size(), 6u);  // (100 - 1) / 16
  auto [x, y] = d.batch({0, 5});
  EXPECT_EQ(x.sizes(), (std::vector<std::int64_t>{2, 16}));
  EXPECT_EQ(x[1][0].item<std::int64_t>(), 80);
  EXPECT_EQ(y[1][15].item<std::int64_t>(), 96);
  EXPECT_TRUE(torch::equal(x.slice(1, 1, 16), y.slice(1, 0, 15)));
}

TEST(LmTask, LossFallsAloneWithLamb) {
  auto c = tiny_config();
  auto train = counting_tokens(20000, 1), held = counting_tokens(4000, 2);
  LmTask task(train, c, 0, 7);
  LmData held_data(held, c.seq_len);
  const auto before = evaluate_lm(task.model(), held_data);
  EXPECT_NEAR(before.perplexity, 32, 8);  // about uniform at the start
  LambConfig lc;
  lc.lr = 1e-2;
  lc.max_grad_norm = 1;
  Lamb opt(task.model()->parameters(), lc);
  for (int i = 0; i < 150; ++i) {
    opt.zero_grad();
    task.forward_backward(16);
    opt.step();
  }
  const auto after = evaluate_lm(task.model(), held_data);
  EXPECT_LT(after.perplexity, 0.5 * before.perplexity)
      << before.perplexity << " -> " << after.perplexity;
  EXPECT_GT(after.accuracy, before.accuracy);
}

TEST(LmTask, TwoPeersTrainTogetherWithIdenticalParameters) {
  auto hub = std::make_shared<test::Hub>(500ms);
  auto o = test::hub_options("lm", 64, 8);
  auto c = tiny_config();
  auto train = counting_tokens(20000, 1), held = counting_tokens(4000, 2);
  LmData held_data(held, c.seq_len);
  constexpr std::uint64_t kEpochs = 60;
  struct Peer {
    test::IoThread io;
    std::shared_ptr<test::FakeCollaboration> collab;
    std::unique_ptr<LmTask> task;
    Lamb* lamb = nullptr;
    std::unique_ptr<Optimizer> opt;
    std::map<std::uint64_t, torch::Tensor> params;
    std::thread thread;
  };
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 2; ++i) {
    auto p = std::make_unique<Peer>();
    p->collab = std::make_shared<test::FakeCollaboration>(hub, p->io.executor());
    p->task = std::make_unique<LmTask>(train, c, 0, 100 + i);
    LambConfig lc;
    lc.lr = 1e-2;
    lc.max_grad_norm = 1;
    lc.schedule = training::LrSchedule{2e-2, 3, 120, 0.1};
    auto lamb = std::make_unique<Lamb>(p->task->model()->parameters(), lc);
    p->lamb = lamb.get();
    p->opt = Optimizer::create(*p->task->model(), std::move(lamb), o, p->collab).value();
    peers.push_back(std::move(p));
  }
  const auto before = evaluate_lm(peers[0]->task->model(), held_data);
  for (auto& pp : peers) {
    Peer* p = pp.get();
    p->thread = std::thread([p] {
      while (p->opt->local_epoch() < kEpochs) {
        p->lamb->set_epoch(p->opt->local_epoch());
        p->task->forward_backward(8);
        auto r = p->opt->step(8);
        if (!r) break;
        if (r.value().stepped || r.value().action == training::Action::download_state) {
          std::vector<torch::Tensor> flat;
          for (auto& t : p->task->model()->parameters()) flat.push_back(t.detach().flatten());
          p->params[p->opt->local_epoch()] = torch::cat(flat);
        }
      }
      // Serve the final state a moment for a peer still behind.
      for (int i = 0; i < 100; ++i) {
        p->opt->serve_state_requests();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  }
  for (auto& p : peers) p->thread.join();
  std::size_t compared = 0;
  for (const auto& [epoch, t] : peers[0]->params) {
    auto it = peers[1]->params.find(epoch);
    if (it == peers[1]->params.end()) continue;
    EXPECT_TRUE(torch::equal(t, it->second)) << "parameters differ at epoch " << epoch;
    ++compared;
  }
  EXPECT_GE(compared, kEpochs / 2);
  EXPECT_GT(hub->rounds_closed, 5u);
  const auto after = evaluate_lm(peers[0]->task->model(), held_data);
  EXPECT_LT(after.perplexity, 0.7 * before.perplexity)
      << before.perplexity << " -> " << after.perplexity;
  for (auto& p : peers) (void)p->opt->shutdown(5s);
}
