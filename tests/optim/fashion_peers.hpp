// Test harness: peers training the built-in Fashion-MNIST task together in one process, each
// with its own io thread, collaboration and training thread, plus the same training alone.
// Used by the convergence-parity, churn and DiLoCo tests.
#pragma once

#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "optim/fake_collaboration.hpp"
#include "starling/optim/fashion_task.hpp"
#include "starling/optim/optimizer.hpp"

namespace starling::test {

struct FashionSetup {
  training::ImageDataset train;
  training::ImageDataset test;
  optim::FashionModel model = optim::FashionModel::mlp;
  double lr = 2e-3;
  std::size_t batch = 32;
};

// The dataset, loaded once per process (nullptr if dataset-fashion-mnist is not installed);
// torch computes on one thread per peer.
inline const FashionSetup* fashion_setup() {
  static const FashionSetup* s = []() -> const FashionSetup* {
    auto train =
        training::load_fashion_mnist(training::kFashionMnistDefaultDir, training::Split::train);
    auto test =
        training::load_fashion_mnist(training::kFashionMnistDefaultDir, training::Split::test);
    if (!train || !test) return nullptr;
    auto* out = new FashionSetup;
    out->train = std::move(train).value();
    out->test = std::move(test).value();
    torch::set_num_threads(1);
    return out;
  }();
  return s;
}

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

// FNV-1a over the bytes of the flattened parameters (identical parameters, identical hash).
inline std::uint64_t parameter_hash(torch::nn::Module& m) {
  auto flat = flat_parameters(m).contiguous();
  const auto* p = static_cast<const unsigned char*>(flat.data_ptr());
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0, n = flat.numel() * flat.element_size(); i < n; ++i)
    h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Every peer's parameter hash after each of its epochs (for agreement checks).
struct ParameterLog {
  struct Entry {
    std::uint64_t peer = 0;
    std::uint64_t hash = 0;
    std::string how;  // how the peer reached the epoch (for the failure message)
  };
  std::mutex mu;
  // epoch -> entries in the order recorded
  std::map<std::uint64_t, std::vector<Entry>> by_epoch;
  void add(std::uint64_t epoch, std::uint64_t peer, std::uint64_t hash, std::string how = {}) {
    std::lock_guard lk(mu);
    by_epoch[epoch].push_back({peer, hash, std::move(how)});
  }
  // Epochs recorded by >= 2 peers where some peer differs from the first.
  std::size_t disagreements(std::size_t* checked) {
    std::lock_guard lk(mu);
    std::size_t bad = 0;
    *checked = 0;
    for (auto& [e, v] : by_epoch) {
      if (v.size() < 2) continue;
      ++*checked;
      bad += !agree(v);
    }
    return bad;
  }
  // Who recorded what at each disagreeing epoch (and the epochs around it).
  std::string disagreement_detail() {
    std::lock_guard lk(mu);
    std::string out;
    for (auto it = by_epoch.begin(); it != by_epoch.end(); ++it) {
      if (it->second.size() < 2 || agree(it->second)) continue;
      auto from = it == by_epoch.begin() ? it : std::prev(it);
      for (auto j = from; j != by_epoch.end() && j->first <= it->first + 1; ++j) {
        out += "epoch " + std::to_string(j->first) + (j == it ? " (disagrees):" : ":");
        for (auto& x : j->second)
          out += " peer " + std::to_string(x.peer) + " hash " + std::to_string(x.hash % 100000) +
                 " [" + x.how + "]";
        out += "\n";
      }
    }
    return out;
  }
  // Epochs in [from, to] that `peer` recorded.
  std::size_t recorded_by(std::uint64_t peer, std::uint64_t from, std::uint64_t to) {
    std::lock_guard lk(mu);
    std::size_t n = 0;
    for (auto it = by_epoch.lower_bound(from); it != by_epoch.end() && it->first <= to; ++it)
      for (auto& x : it->second) n += x.peer == peer;
    return n;
  }

 private:
  static bool agree(const std::vector<Entry>& v) {
    for (auto& x : v)
      if (x.hash != v.front().hash) return false;
    return true;
  }
};

// "round of 3 (2048 samples)", "alone", "loaded", for ParameterLog entries.
inline std::string step_description(const optim::StepReport& r, bool loaded) {
  if (loaded) return "loaded state";
  if (r.group_size > 1)
    return "round of " + std::to_string(r.group_size) + " (" +
           std::to_string(static_cast<long long>(r.group_samples)) + " samples)";
  return "alone (" + std::to_string(static_cast<long long>(r.group_samples)) + " samples)" +
         (r.round_error ? ", after: " + r.round_error->message() : "");
}

class FashionPeer {
 public:
  // Over the Hub double (nullptr: alone).
  FashionPeer(const FashionSetup& s, std::shared_ptr<Hub> hub, optim::OptimizerOptions o,
              std::uint64_t model_seed, std::uint64_t data_seed)
      : task_(s.train, s.model, model_seed, data_seed), batch_(s.batch), id_(data_seed) {
    if (hub) fake_ = std::make_shared<FakeCollaboration>(hub, io_.executor());
    create_optimizer(s, std::move(o), fake_);
  }
  // Over any collaboration (a NetCollaboration: its node runs its own io thread).
  FashionPeer(const FashionSetup& s, std::shared_ptr<training::Collaboration> collab,
              optim::OptimizerOptions o, std::uint64_t model_seed, std::uint64_t data_seed)
      : task_(s.train, s.model, model_seed, data_seed), batch_(s.batch), id_(data_seed) {
    create_optimizer(s, std::move(o), std::move(collab));
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
        if (stop_at_matchmaking_ && last_action_ == training::Action::begin_matchmaking) break;
        task_.forward_backward(batch_);
        const auto before = opt_->local_epoch();
        auto rep = opt_->step(batch_);
        if (!rep) {
          ++failures;
          break;
        }
        // A state download that loaded another epoch (not one skipped in a retry backoff).
        const bool loaded = rep.value().action == training::Action::download_state &&
                            !rep.value().round_error && rep.value().epoch != before;
        epoch = opt_->local_epoch();  // before the counters a test waits on
        if (loaded) ++downloads;
        if (rep.value().round_error) ++round_errors;
        bytes_sent += rep.value().bytes_sent;
        if (rep.value().stepped && rep.value().group_size > 1) ++rounds;
        if (rep.value().stepped)
          stepped_samples += static_cast<std::uint64_t>(rep.value().group_samples);
        last_action_ = rep.value().action;
        if (log && (rep.value().stepped || loaded))
          log->add(opt_->local_epoch(), id_, parameter_hash(*task_.model()),
                   step_description(rep.value(), loaded));
        samples += batch_;
        if (pace_ > Duration::zero()) std::this_thread::sleep_for(pace_);
      }
      finished = true;
      // Serve the final state to peers still behind until stop() (`starling train --linger`):
      // state is serialised by the training thread.
      while (linger_ && !stop_) {
        opt_->serve_state_requests();
        std::this_thread::sleep_for(20ms);
      }
    });
  }
  // After reaching its epochs, the training thread serves state until stop(). Before start().
  void linger() { linger_ = true; }
  // Each local step takes at least `d` more (a slower peer or bigger model). Before start().
  void pace(Duration d) { pace_ = d; }
  void stop() { stop_ = true; }
  // Waits until the training thread ends (it ends by itself at `epochs`, or after stop()).
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  // As if the process died: stops computing and drops out of the collaboration at once.
  void kill() {
    stop();
    join();
    if (fake_) fake_->leave();
  }
  // Ends the training thread right after a step() that began matchmaking for a round (the
  // moment a death hurts the others most: they count on this peer joining the round).
  void stop_at_matchmaking() { stop_at_matchmaking_ = true; }
  // Shuts the optimizer down (bounded by `timeout` plus its own grace) and destroys it; the
  // model stays. After the training thread ended.
  void drop_optimizer(Duration timeout) {
    if (!opt_) return;
    (void)opt_->shutdown(timeout);
    opt_.reset();
  }
  std::uint64_t id() const { return id_; }
  optim::Evaluation evaluate(const optim::FashionData& test) {
    return optim::evaluate(task_.model(), test);
  }
  optim::Optimizer& optimizer() { return *opt_; }
  torch::nn::Sequential& model() { return task_.model(); }

  std::atomic<std::uint64_t> epoch{0};
  std::atomic<std::uint64_t> samples{0};
  std::atomic<std::uint64_t> bytes_sent{0};
  std::atomic<int> downloads{0};
  std::atomic<int> rounds{0};                     // collaborative steps (a group of two or more)
  std::atomic<std::uint64_t> stepped_samples{0};  // samples the applied steps averaged over
  std::atomic<int> round_errors{0};
  std::atomic<int> failures{0};
  std::atomic<bool> finished{false};

 private:
  void create_optimizer(const FashionSetup& s, optim::OptimizerOptions o,
                        std::shared_ptr<training::Collaboration> collab) {
    auto adam = std::make_unique<torch::optim::Adam>(task_.model()->parameters(),
                                                     torch::optim::AdamOptions(s.lr));
    opt_ =
        optim::Optimizer::create(*task_.model(), std::move(adam), std::move(o), std::move(collab))
            .value();
  }

  IoThread io_;
  std::shared_ptr<FakeCollaboration> fake_;
  optim::FashionTask task_;
  std::size_t batch_;
  std::uint64_t id_;
  std::unique_ptr<optim::Optimizer> opt_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stop_at_matchmaking_{false};
  bool linger_ = false;
  Duration pace_{0};
  std::atomic<training::Action> last_action_{training::Action::accumulate};
};

// The alone anchor's options for "same total samples and batch size" as a collaboration whose
// `epochs` steps averaged `stepped_samples` in all: a step every B samples, B the mean samples
// per collaborative step rounded to whole local batches.
inline optim::OptimizerOptions same_samples_alone(optim::OptimizerOptions o,
                                                  std::uint64_t stepped_samples,
                                                  std::uint64_t epochs) {
  const double mean = static_cast<double>(stepped_samples) / static_cast<double>(epochs);
  const double batch = static_cast<double>(o.batch_size);
  o.target_batch_size = static_cast<std::uint64_t>(std::max(1.0, std::round(mean / batch)) * batch);
  return o;
}

// Trains one process alone (no collaboration) to `epochs` and returns its test accuracy.
inline double train_alone(const FashionSetup& s, const optim::OptimizerOptions& o,
                          std::uint64_t epochs, std::uint64_t data_seed = 1) {
  const std::shared_ptr<Hub> none;
  FashionPeer alone(s, none, o, 0, data_seed);
  alone.start(epochs);
  alone.join();
  EXPECT_EQ(alone.optimizer().local_epoch(), epochs);
  optim::FashionData test(s.test);
  return alone.evaluate(test).accuracy;
}

// The reference for the parity tests: training alone is as noisy as one run of it (its data
// order alone moves the final accuracy by about a point at 60 steps), so the mean over
// `runs` data orders, each printed.
inline double train_alone_mean(const FashionSetup& s, const optim::OptimizerOptions& o,
                               std::uint64_t epochs, int runs = 3) {
  double sum = 0;
  std::string each;
  for (int i = 0; i < runs; ++i) {
    const double a = train_alone(s, o, epochs, 1 + static_cast<std::uint64_t>(i));
    sum += a;
    each += (i ? " " : "") + std::to_string(a).substr(0, 6);
  }
  std::printf("alone, %d data orders: %s\n", runs, each.c_str());
  return sum / runs;
}

inline bool wait_for(const std::function<bool()>& pred, Duration limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

}  // namespace starling::test
