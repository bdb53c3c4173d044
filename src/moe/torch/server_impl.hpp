// ExpertServer internals shared by expert_server.cpp (RPC, runtime thread, declarations) and
// expert_backend.cpp (one batch's compute).
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "starling/averaging/averager.hpp"
#include "starling/moe/expert_server.hpp"
#include "starling/pb/moe.pb.h"

namespace starling::moe {

struct Backend {
  ExpertSchema schema;
  ExpertModule module;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::size_t forward_pool = 0;
  std::size_t backward_pool = 0;
  // Runtime-thread state: steps and rows trained (restored from the checkpoint), and the
  // step count at the last checkpoint.
  std::uint64_t steps = 0;
  std::uint64_t samples = 0;
  std::uint64_t saved_steps = 0;
  // Rows backpropagated since the last optimizer step (their gradients are accumulated in
  // the parameters' .grad), and when the first of them came.
  std::uint64_t accumulated_rows = 0;
  TimePoint accumulating_since{};
  // Replica state transfer (share_state / download_state): the averager serving this expert's
  // blob; the newest snapshot (under ExpertServer::Impl::mu) and the steps it holds.
  std::shared_ptr<averaging::Averager> state;
  std::uint64_t snapshot_steps = 0;  // runtime thread
  std::shared_ptr<const Bytes> snapshot;
  std::uint64_t snapshot_epoch = 0;
  bool snapshot_new = false;
  bool shared_once = false;  // io thread
};

// Reloads the expert's checkpoint from `dir` if there is one (true if loaded).
result<bool> load_expert_checkpoint(const std::filesystem::path& dir, Backend& b);
// Writes the expert's checkpoint to `dir` atomically.
result<void> save_expert_checkpoint(const std::filesystem::path& dir, Backend& b);
// The expert's training state as bytes (optim/training_state.hpp).
result<Bytes> expert_state(Backend& b);
// Loads downloaded state into the expert (errors name it).
result<void> load_expert_state(BytesView state, std::uint64_t steps, Backend& b);
// The averager that shares / downloads the expert's state (not started).
result<std::shared_ptr<averaging::Averager>> make_state_averager(
    const std::shared_ptr<net::Host>& host, const std::shared_ptr<averaging::Directory>& dir,
    const std::string& uid);

// A request waiting for the runtime. Lives on the io thread: `done` and `out` are touched
// only there (the runtime posts its answer).
struct Pending {
  explicit Pending(asio::any_io_executor ex) : done(std::move(ex)) {}
  AsyncEvent done;
  std::optional<result<pb::ExpertResponse>> out;
};

struct Task {
  pb::ExpertRequest request;
  std::size_t rows = 0;
  averaging::CodecSpec codec;
  asio::any_io_executor ex;
  std::shared_ptr<Pending> pending;
};

// Posts the answer of `t` to its io thread.
void complete(Task& t, result<pb::ExpertResponse> r);

// Applies the accumulated gradients: one optimizer step of the expert. Runtime thread.
void step_expert(ExpertServerStats& stats, Backend& b);

// Runs one batch of one expert (tasks in arrival order) and completes every task.
void run_batch(const ExpertServerConfig& cfg, ExpertServerStats& stats, Backend& b, bool backward,
               std::vector<Task>& tasks);

}  // namespace starling::moe
