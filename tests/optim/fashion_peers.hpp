// Test harness: peers training the built-in Fashion-MNIST task together in one process, each
// with its own io thread, collaboration and training thread, plus the same training alone.
// Used by the convergence-parity, churn and DiLoCo tests.
#pragma once

#include <torch/optim/adam.h>
#include <torch/utils.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "optim/fake_collaboration.hpp"
#include "starling/optim/fashion_task.hpp"
#include "starling/optim/optimizer.hpp"

namespace starling::test {

struct FashionSetup {
  optim::ImageDataset train;
  optim::ImageDataset test;
  optim::FashionModel model = optim::FashionModel::mlp;
  double lr = 2e-3;
  std::size_t batch = 32;
};

// Optimizer options for quick in-process runs: epochs of a fraction of a second, so progress is
// published and fetched far more often than the defaults (tuned for the internet) do.
inline optim::OptimizerOptions fast_options(std::uint64_t target, std::size_t batch) {
  optim::OptimizerOptions o;
  o.run_id = "fashion-test";
  o.target_batch_size = target;
  o.batch_size = batch;
  o.matchmaking_time = 200ms;
  o.averaging_timeout = 20s;
  o.load_state_timeout = 20s;
  o.progress.min_refresh = 20ms;
  o.progress.max_refresh = 200ms;
  o.progress.max_publish_interval = 100ms;
  o.progress.stale_after = 3s;
  o.progress_ttl = 10s;
  return o;
}

inline torch::Tensor flat_parameters(torch::nn::Module& m) {
  std::vector<torch::Tensor> v;
  for (auto& p : m.parameters()) v.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(v);
}

// Parameters of every peer after each of its epochs (for agreement checks).
struct ParameterLog {
  std::mutex mu;
  std::map<std::uint64_t, std::vector<torch::Tensor>> by_epoch;
  void add(std::uint64_t epoch, torch::Tensor t) {
    std::lock_guard lk(mu);
    by_epoch[epoch].push_back(std::move(t));
  }
  // Epochs recorded by >= 2 peers where some peer differs from the first.
  std::size_t disagreements(std::size_t* checked) {
    std::lock_guard lk(mu);
    std::size_t bad = 0;
    *checked = 0;
    for (auto& [e, v] : by_epoch) {
      if (v.size() < 2) continue;
      ++*checked;
      for (std::size_t i = 1; i < v.size(); ++i)
        if (!torch::equal(v[0], v[i])) {
          ++bad;
          break;
        }
    }
    return bad;
  }
};

class FashionPeer {
 public:
  FashionPeer(const FashionSetup& s, std::shared_ptr<Hub> hub, optim::OptimizerOptions o,
              std::uint64_t model_seed, std::uint64_t data_seed)
      : task_(s.train, s.model, model_seed, data_seed), batch_(s.batch) {
    if (hub) collab_ = std::make_shared<FakeCollaboration>(hub, io_.executor());
    auto adam = std::make_unique<torch::optim::Adam>(task_.model()->parameters(),
                                                     torch::optim::AdamOptions(s.lr));
    opt_ = optim::Optimizer::create(*task_.model(), std::move(adam), o, collab_).value();
  }
  ~FashionPeer() {
    stop();
    join();
  }

  // Trains on a thread until the local epoch reaches `epochs` or stop(); records the
  // parameters after every epoch change into `log` (if given).
  void start(std::uint64_t epochs, ParameterLog* log = nullptr) {
    thread_ = std::thread([this, epochs, log] {
      while (!stop_ && opt_->local_epoch() < epochs) {
        task_.forward_backward(batch_);
        auto rep = opt_->step(batch_);
        if (!rep) {
          ++failures;
          break;
        }
        if (rep.value().action == optim::Action::download_state && !rep.value().round_error)
          ++downloads;
        if (rep.value().round_error) ++round_errors;
        bytes_sent += rep.value().bytes_sent;
        if (log && (rep.value().stepped || rep.value().action == optim::Action::download_state))
          log->add(opt_->local_epoch(), flat_parameters(*task_.model()));
        epoch = opt_->local_epoch();
        samples += batch_;
      }
      finished = true;
    });
  }
  void stop() { stop_ = true; }
  // Waits until the training thread ends (it ends by itself at `epochs`, or after stop()).
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  // As if the process died: stops computing and drops out of the collaboration at once.
  void kill() {
    stop();
    join();
    if (collab_) collab_->leave();
  }
  optim::Evaluation evaluate(const optim::FashionData& test) {
    return optim::evaluate(task_.model(), test);
  }
  optim::Optimizer& optimizer() { return *opt_; }
  torch::nn::Sequential& model() { return task_.model(); }

  std::atomic<std::uint64_t> epoch{0};
  std::atomic<std::uint64_t> samples{0};
  std::atomic<std::uint64_t> bytes_sent{0};
  std::atomic<int> downloads{0};
  std::atomic<int> round_errors{0};
  std::atomic<int> failures{0};
  std::atomic<bool> finished{false};

 private:
  IoThread io_;
  std::shared_ptr<FakeCollaboration> collab_;
  optim::FashionTask task_;
  std::size_t batch_;
  std::unique_ptr<optim::Optimizer> opt_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

inline bool wait_for(const std::function<bool()>& pred, Duration limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

}  // namespace starling::test
