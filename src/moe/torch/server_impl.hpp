// ExpertServer internals shared by expert_server.cpp (RPC, declarations, replica state),
// server_runtime.cpp (the runtime thread) and expert_backend.cpp (one batch's compute).
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <variant>

#include "starling/averaging/averager.hpp"
#include "starling/moe/expert_directory.hpp"
#include "starling/moe/expert_server.hpp"
#include "starling/net/rpc.hpp"
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
  // Replica averaging (average_period): the averager of this expert's parameters.
  std::shared_ptr<averaging::Averager> params_avg;
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

// What the runtime answers a streamed request with: the output rows (encoded frame by frame
// on the io thread as they are sent, stream_server.cpp).
struct StreamedAnswer {
  torch::Tensor rows;  // contiguous float32 [shape]: a view of the batch's output
  std::vector<std::int64_t> shape;
  std::uint64_t expert_step = 0;
  averaging::CodecSpec codec;
};
// A one-message request's answer, or a streamed request's.
using TaskAnswer = std::variant<pb::ExpertResponse, StreamedAnswer>;

// The averager of the expert's parameters among its replicas (not started).
result<std::shared_ptr<averaging::Averager>> make_params_averager(
    const std::shared_ptr<net::Host>& host, const std::shared_ptr<averaging::Directory>& dir,
    Backend& b);

// A request waiting for the runtime. Lives on the io thread: `done` and `out` are touched
// only there (the runtime posts its answer).
struct Pending {
  explicit Pending(asio::any_io_executor ex) : done(std::move(ex)) {}
  AsyncEvent done;
  std::optional<result<TaskAnswer>> out;
};

struct Task {
  pb::ExpertRequest request;              // a one-message request (decoded by the runtime)
  std::optional<DecodedRequest> decoded;  // a streamed request (decoded as it came)
  bool streamed = false;                  // answered with a StreamedAnswer
  std::size_t rows = 0;
  averaging::CodecSpec codec;
  asio::any_io_executor ex;
  std::shared_ptr<Pending> pending;
};

// Posts the answer of `t` to its io thread.
void complete(Task& t, result<TaskAnswer> r);

// Applies the accumulated gradients: one optimizer step of the expert. Runtime thread.
void step_expert(ExpertServerStats& stats, Backend& b);

// Runs one batch of one expert (tasks in arrival order) and completes every task.
void run_batch(const ExpertServerConfig& cfg, ExpertServerStats& stats, Backend& b, bool backward,
               std::vector<Task>& tasks);

// The server's state. The runtime thread's members are in server_runtime.cpp, the RPC
// handlers, declarations and replica state in expert_server.cpp.
struct ExpertServer::Impl : std::enable_shared_from_this<ExpertServer::Impl> {
  std::shared_ptr<net::Host> host;
  std::shared_ptr<averaging::Directory> directory;
  ExpertServerConfig cfg;
  std::shared_ptr<ExpertServerStats> stats;
  std::vector<std::unique_ptr<Backend>> backends;
  std::map<std::string, Backend*> by_uid;
  std::vector<ExpertUid> uids;
  std::unique_ptr<net::RpcServer> rpc;
  std::unique_ptr<TaskScope> scope;
  std::unique_ptr<ExpertDirectory> experts_dir;

  // Runtime thread state (mu guards all of it).
  std::mutex mu;
  std::condition_variable cv;
  BatchScheduler sched;
  std::map<BatchScheduler::TaskId, Task> queued;
  std::map<std::size_t, std::pair<Backend*, bool>> pool_owner;  // pool -> (expert, backward)
  bool stopping = false;
  // stop() (not the destructor): the runtime applies the accumulated gradients (SWARM steps)
  // and saves the checkpoints once more, giving up the steps past stop_deadline.
  bool final_save = false;
  TimePoint stop_deadline{};
  std::atomic<bool> runtime_exited{false};
  std::thread runtime;
  bool started = false;
  std::mt19937_64 failure_rng{std::random_device{}()};  // io thread only

  // Whether to fail this call (cfg.inject_failure_rate). Io thread.
  bool injected_failure();

  // Saves the checkpoint of every expert that stepped since its last one. Runtime thread (or
  // after it exited).
  void save_checkpoints();

  // Snapshots the state of every expert that stepped since its last snapshot, for replicas.
  // Runtime thread (or before it starts); takes mu to publish.
  void take_snapshots();

  // SWARM mode with a time bound: steps every expert whose first accumulated gradient is
  // max_step_delay old; returns when the next one is due. Runtime thread.
  std::optional<TimePoint> step_overdue();

  // One last optimizer step of every expert with accumulated gradients (none past `until`).
  // Runtime thread.
  void apply_accumulated(TimePoint until);

  // The runtime thread: run_batches() until stopping, then the final checkpoints if stop()
  // asked for them.
  void runtime_loop();
  void run_batches();

  // Queues a request (t.request or t.decoded, t.rows rows) for expert `uid`'s runtime and
  // waits for its answer (the call's deadline).
  awaitable<result<TaskAnswer>> submit(bool backward, const net::RpcContext& ctx,
                                       const std::string& uid, Task t);
  // The info / forward / backward RPC methods, and the streamed ones (register_stream_methods).
  void register_methods(std::weak_ptr<Impl> weak);
  void register_stream_methods(std::weak_ptr<Impl> weak);
  // Bytes held by streamed requests and answers in flight (io thread), against
  // cfg.max_stream_bytes.
  std::uint64_t stream_bytes = 0;

  // Jobs for the runtime thread (under mu): run between batches, in order.
  std::vector<std::function<void()>> runtime_jobs;
  // Runs `fn` on the runtime thread and waits (at most `timeout`) until it ran; false if it
  // did not (stopping, or the runtime busy past the timeout). Io thread.
  awaitable<bool> on_runtime(std::function<void()> fn, Duration timeout);

  // Replica averaging: every average_period, one round per expert with replicas.
  static awaitable<void> average_loop(std::weak_ptr<Impl> weak);
  awaitable<void> average_expert(Backend* b, std::string round);

  // Downloads the state of every expert without a restored checkpoint from its replicas
  // (before the runtime thread starts: the modules are this thread's).
  awaitable<void> download_states();

  // Serves each expert's newest snapshot (a new one is shared, an old one re-announced).
  awaitable<void> share_snapshots();

  // This server as the declarations name it.
  Declaration self_declaration() const;
};

}  // namespace starling::moe
