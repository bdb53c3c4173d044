// starling::Optimizer in DiLoCo mode over the real NetCollaboration (peers on loopback, each
// with its own io thread, Host and DhtNode): outer rounds average pseudo-gradients with
// identical parameters on every peer after each round, and a peer that dies abruptly
// (test::CrashableNode::crash: no goodbye, mid-matchmaking or not) never stalls the others.
// The quick networked counterpart of the soak tests in tests/optim_soak/.
#include <gtest/gtest.h>

#include <torch/nn.h>
#include <torch/optim/sgd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "optim/linear_task.hpp"
#include "starling/optim/optimizer.hpp"
#include "support/crashable_node.hpp"

using namespace starling;
using namespace starling::optim;
using namespace starling::training;

namespace {

using Record = std::map<std::uint64_t, std::vector<torch::Tensor>>;

OptimizerOptions options() {
  auto o = test::loopback_options("netdiloco", 8);
  // An outer round every 40 local steps of ~20 ms: rounds a second or two apart, well above
  // the progress refresh (with rounds shorter than the refresh, every peer sees the others
  // behind and steps alone).
  o.diloco_steps = 40;
  return o;
}

struct Peer {
  std::unique_ptr<test::CrashableNode> node;
  torch::nn::Linear model;
  std::unique_ptr<Optimizer> opt;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> epoch{0};
  std::atomic<int> failures{0}, rounds{0};

  Peer(int seed, const std::vector<net::Multiaddr>& bootstrap) : model(test::make_linear(seed)) {
    node = test::CrashableNode::start(bootstrap, test::loopback_config(options()));
    opt = Optimizer::create(*model, std::make_unique<torch::optim::SGD>(model->parameters(), 0.05),
                            options(), node->collaboration())
              .value();
  }
  void start(int seed, std::mutex& mu, Record& rec) {
    thread = std::thread([this, seed, &mu, &rec] {
      torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(seed);
      while (!stop) {
        auto [x, y] = test::batch(gen, 8);
        torch::mse_loss(model->forward(x), y).backward();
        auto rep = opt->step();
        if (!rep) {
          ++failures;
          break;
        }
        if (rep.value().stepped && rep.value().group_size > 1) ++rounds;
        if (rep.value().stepped) {
          std::lock_guard lk(mu);
          rec[opt->local_epoch()].push_back(test::flat_params(*model));
        }
        epoch = opt->local_epoch();
        std::this_thread::sleep_for(20ms);
      }
    });
  }
  void halt() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
  // Dies abruptly: the io thread stops, the optimizer is dropped (its shutdown cannot send
  // anything), the node is torn down.
  void crash() {
    halt();
    node->freeze();
    (void)opt->shutdown(Duration::zero());
    opt.reset();
    node->crash();
  }
  ~Peer() {
    halt();
    if (opt) (void)opt->shutdown(10s);
    opt.reset();
    node.reset();
  }
};

}  // namespace

TEST(NetDiloco, OuterRoundsAgreeAndAnAbruptDeathDoesNotStall) {
  std::mutex mu;
  Record record;
  std::vector<std::unique_ptr<Peer>> peers;
  // The first peer starts the run alone (peers that start together would each step alone at
  // epoch 0 before they see each other); the others join and download its state.
  peers.push_back(std::make_unique<Peer>(1, std::vector<net::Multiaddr>{}));
  peers[0]->start(100, mu, record);
  ASSERT_TRUE(test::wait_until([&] { return peers[0]->epoch >= 1; }, 60s)) << "no progress";
  for (int i = 1; i < 3; ++i) {
    peers.push_back(std::make_unique<Peer>(i + 1, peers[0]->node->listen_addresses()));
    peers[i]->start(100 + i, mu, record);
  }
  auto min_epoch = [&] { return test::min_live_epoch(peers); };
  ASSERT_TRUE(test::wait_until([&] { return min_epoch() >= 2; }, 120s)) << "no progress";
  const std::uint64_t joined_at = min_epoch();
  ASSERT_TRUE(test::wait_until([&] { return peers[0]->rounds > 0; }, 60s)) << "no round";

  // The DHT's first node dies without a goodbye; the other two continue.
  peers[0]->crash();
  const std::uint64_t died_at = min_epoch();
  ASSERT_TRUE(test::wait_until([&] { return min_epoch() >= died_at + 2; }, 120s)) << "stalled";

  int rounds = 0;
  for (auto& p : peers) {
    p->halt();
    std::printf("peer: epoch %llu, %d outer rounds with others\n",
                static_cast<unsigned long long>(p->epoch.load()), p->rounds.load());
    EXPECT_EQ(p->failures, 0);
    rounds += p->rounds;
  }
  EXPECT_GT(rounds, 0) << "no collaborative outer round";
  EXPECT_GT(peers[1]->node->bytes_sent(), 0u);
  {
    std::lock_guard lk(mu);
    record.erase(record.begin(), record.lower_bound(joined_at));  // before all had joined
    test::expect_agreement(record, 2);
  }
  torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(999);
  auto [x, y] = test::batch(gen, 1000);
  auto initial = test::make_linear(1);
  const double before = torch::mse_loss(initial->forward(x), y).item<double>();
  const double after = torch::mse_loss(peers[1]->model->forward(x), y).item<double>();
  EXPECT_LT(after, 0.5 * before) << before << " -> " << after;
}
