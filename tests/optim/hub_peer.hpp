// One optimizer peer over the in-process Hub double (fake_collaboration.hpp) for multi-peer
// tests: its io thread, collaboration, linear model (from a seed) and optimizer, and a training
// thread that records the parameters after every epoch it steps to or downloads.
#pragma once

#include <torch/nn.h>
#include <torch/optim/sgd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "optim/fake_collaboration.hpp"
#include "optim/linear_task.hpp"
#include "starling/optim/optimizer.hpp"

namespace starling::test {

// Optimizer options for peers over the Hub: rounds bounded by seconds, progress refreshed a
// few times a second (the Hub answers at once).
inline optim::OptimizerOptions hub_options(std::string run_id, std::uint64_t target,
                                           std::size_t batch_size) {
  optim::OptimizerOptions o;
  o.run_id = std::move(run_id);
  o.target_batch_size = target;
  o.batch_size = batch_size;
  o.matchmaking_time = 1s;
  o.averaging_timeout = 5s;
  o.load_state_timeout = 10s;
  o.progress.min_refresh = 50ms;
  o.progress.max_refresh = 500ms;
  o.progress.max_publish_interval = 200ms;
  o.progress.stale_after = 3s;
  o.progress_ttl = 10s;
  return o;
}

struct HubPeer {
  std::shared_ptr<Hub> hub;
  IoThread io;
  std::shared_ptr<FakeCollaboration> collab;
  torch::nn::Linear model;
  std::unique_ptr<optim::Optimizer> opt;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> epoch{0};
  std::atomic<int> downloads{0};
  std::atomic<int> failures{0};
  std::atomic<int> solo_steps{0};  // steps without a group (diagnostic: forks the parameters)

  HubPeer(std::shared_ptr<Hub> h, int seed, const optim::OptimizerOptions& o)
      : hub(std::move(h)), model(make_linear(seed)) {
    collab = std::make_shared<FakeCollaboration>(hub, io.executor());
    opt = optim::Optimizer::create(
              *model, std::make_unique<torch::optim::SGD>(model->parameters(), 0.05), o, collab)
              .value();
  }
  // Trains until stop is set (or `max_epoch` is reached, if not 0), recording the parameters
  // after every step into `record`.
  void start(int seed, std::mutex& mu, std::map<std::uint64_t, std::vector<torch::Tensor>>& record,
             std::uint64_t max_epoch = 0) {
    thread = std::thread([this, seed, &mu, &record, max_epoch] {
      torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(seed);
      while (!stop && (max_epoch == 0 || epoch < max_epoch)) {
        auto [x, y] = batch(gen, 8);
        torch::mse_loss(model->forward(x), y).backward();
        auto rep = opt->step();
        if (!rep) {
          ++failures;
          break;
        }
        if (rep.value().action == training::Action::download_state && !rep.value().round_error)
          ++downloads;
        if (rep.value().stepped && rep.value().group_size < 2) ++solo_steps;
        if (rep.value().stepped || rep.value().action == training::Action::download_state) {
          std::lock_guard lk(mu);
          // The collaboration's parameters (with delayed updates the model may hold a
          // prediction of the next step's).
          opt->with_collaboration_parameters(
              [&] { record[opt->local_epoch()].push_back(flat_params(*model)); });
        }
        epoch = opt->local_epoch();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // <= 1600 samples/s
      }
      // At the last epoch: serve the state to peers that are still behind.
      while (!stop) {
        opt->serve_state_requests();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  }
  void kill() {
    stop = true;
    if (thread.joinable()) thread.join();
    collab->leave();  // as if the process died: no more rounds, no state serving
  }
  ~HubPeer() {
    stop = true;
    if (thread.joinable()) thread.join();
    opt.reset();
  }
};

}  // namespace starling::test
