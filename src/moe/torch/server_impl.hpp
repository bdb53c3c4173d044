// ExpertServer internals shared by expert_server.cpp (RPC, runtime thread, declarations) and
// expert_backend.cpp (one batch's compute).
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

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
};

// Reloads the expert's checkpoint from `dir` if there is one (true if loaded).
result<bool> load_expert_checkpoint(const std::filesystem::path& dir, Backend& b);
// Writes the expert's checkpoint to `dir` atomically.
result<void> save_expert_checkpoint(const std::filesystem::path& dir, Backend& b);

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

// Runs one batch of one expert (tasks in arrival order) and completes every task.
void run_batch(const ExpertServerConfig& cfg, ExpertServerStats& stats, Backend& b, bool backward,
               std::vector<Task>& tasks);

}  // namespace starling::moe
