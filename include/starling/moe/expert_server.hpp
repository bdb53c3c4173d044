// ExpertServer: hosts experts (torch modules) on a libp2p Host and serves
// /starling/moe/1.0.0 info / forward / backward (docs/moe.md). Forward runs without grad;
// backward recomputes the forward from the inputs it receives and returns the input
// gradients. The expert's optimizer steps once per backward batch (Learning@home, the
// default) or, with `step_samples`, once that many rows have been backpropagated (SWARM:
// gradients accumulate in between), with a bound on gradient staleness (`max_staleness`).
// Every answer carries the expert's step count; a backward carrying the step of its forward
// is refused when that forward is more than `max_staleness` steps old.
//
// Batching: one pool per expert and direction (batching.hpp), one runtime thread that takes
// the oldest ready batch across all pools, concatenates its requests, runs the module once and
// splits the answer. Requests are decoded, checked and encoded on the runtime thread, never on
// the io thread.
//
// Declarations: with a directory, start() declares every uid and prefix (expert_directory.hpp)
// and a background task re-declares them every `declare_period` with ttl `declare_ttl`.
//
// Limits against hostile peers (config field -> what happens):
//   limits.max_elements / max_dims / max_tensors  oversized tensors: INVALID_ARGUMENT /
//                                                 RESOURCE_EXHAUSTED naming the tensor
//   pool.max_batch          rows in one request beyond it: INVALID_ARGUMENT
//   max_queued_tasks        queued requests beyond it: RESOURCE_EXHAUSTED (stats.refused)
//   rpc.max_calls_per_peer  the RPC framework's per-peer bound
//   max_frame_size / max_stream_bytes  streamed calls (below)
// Wrong shapes, unknown uid, inf/nan, garbage protobuf: an error status naming the problem;
// the server keeps serving the others (stats.bad_requests).
//
// Checkpoints: with `checkpoint_dir` set, add_expert() reloads `<dir>/<uid>.stc` if it exists
// (parameters, buffers, optimizer state, optimizer step and sample counts; a file that does
// not match the expert is an error), the runtime thread rewrites the file of every expert
// that stepped since its last save every `checkpoint_period` (between batches, atomically:
// temporary file + fsync + rename, training/checkpoint.hpp), and after stop() the runtime
// thread saves once more as it exits (never the io thread).
//
// Threading rule: create/add_expert from any thread before start(); start()/stop() are
// coroutines on the host's executor (BlockingExpertServer wraps them). Modules and optimizers
// are touched only by the runtime thread after start().
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn.h>
#include <torch/optim.h>

#include "starling/averaging/directory.hpp"
#include "starling/moe/batching.hpp"
#include "starling/moe/uid.hpp"
#include "starling/moe/wire.hpp"
#include "starling/net/host.hpp"

namespace starling::moe {

// What a server needs to host one expert: a module mapping [N, in...] -> [N, out...] and its
// optimizer over the module's parameters.
struct ExpertModule {
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::shared_ptr<torch::nn::Module> parameters;  // the module itself (for parameters/state)
  std::vector<std::int64_t> input_shape;
  std::vector<std::int64_t> output_shape;
  std::string type = "custom";
};
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

// Built-in feed-forward expert: Linear(d, hidden) -> GELU -> Linear(hidden, d), with a
// residual-free output of width d. Deterministic for a given seed.
ExpertModule make_ffn_expert(std::int64_t dim, std::int64_t hidden, std::uint64_t seed);
// Built-in transformer expert: one transformer encoder block (self-attention with `heads`
// heads, 0: the most of 8/4/2 that leaves >= 8 dims per head, else 1; then a GELU
// feed-forward of width `hidden`; residuals and post-LayerNorms; no dropout) on sequences:
// [N, seq_len, dim] -> [N, seq_len, dim]. Deterministic for a given seed.
ExpertModule make_transformer_expert(std::int64_t dim, std::int64_t hidden, std::int64_t seq_len,
                                     std::int64_t heads, std::uint64_t seed);
// Built-in expert types by name ("ffn", "transformer"): dim, hidden (and for transformer
// seq_len, heads) from the arguments; invalid_argument naming a bad one.
result<ExpertModule> make_builtin_expert(const std::string& type, std::int64_t dim,
                                         std::int64_t hidden, std::uint64_t seed,
                                         std::int64_t seq_len = 16, std::int64_t heads = 0);
// Adam with learning rate `lr`.
OptimizerFactory adam_factory(double lr);
// SGD with learning rate `lr` (momentum 0).
OptimizerFactory sgd_factory(double lr);

struct ExpertServerConfig {
  PoolConfig forward_pool;     // per expert
  PoolConfig backward_pool;    // per expert
  averaging::CodecSpec codec;  // default codec of the answers
  WireLimits limits;
  std::size_t max_queued_tasks = 4096;
  Duration declare_period = 10s;
  Duration declare_ttl = 20s;  // about 2x declare_period
  Duration stop_timeout = 5s;
  std::size_t max_message_size = 64u << 20;  // one-message calls
  // Streamed calls (stream.hpp; limits.max_stream_elements / max_chunk_elements bound one
  // tensor and one chunk): every frame at most `max_frame_size` bytes; answers in chunks of
  // `stream_chunk_values` values; the requests and answers of all streamed calls in flight
  // together hold at most `max_stream_bytes` (a call past it: RESOURCE_EXHAUSTED). A stream's
  // header is checked against the expert's schema (uid, tensor count, shapes, max_batch)
  // before anything is allocated; a bad frame ends the call with INVALID_ARGUMENT (logged,
  // stats.bad_requests).
  std::size_t max_frame_size = 16u << 20;
  std::uint64_t stream_chunk_values = 512u << 10;
  std::uint64_t max_stream_bytes = 1ull << 30;
  // A streamed call (upload, compute, answer) running longer is ended and its share of
  // max_stream_bytes freed, so a peer that opens streams and goes quiet holds the budget for
  // at most this long (not the RPC server's 10 min cap).
  Duration max_stream_duration = 60s;
  std::filesystem::path checkpoint_dir;  // empty: no checkpoints
  Duration checkpoint_period = 60s;
  // Experiments: answer this fraction of forward/backward calls with errc::unavailable
  // (stats.injected_failures), as a flaky peer would.
  double inject_failure_rate = 0;
  // Replicas (needs a directory): `share_state` serves every expert's state (parameters and
  // optimizer) to other servers of the same uid through the averaging state transfer
  // (averaging/state_transfer.hpp, one blob per expert, key prefix "moe.<uid>"): the runtime
  // thread snapshots the experts that stepped every `declare_period`, announced with the
  // declarations. `download_state`: start() first downloads the state of every expert not
  // restored from a checkpoint from the replicas that share it (bounded by
  // `state_download_timeout`; none found: the expert starts fresh).
  bool share_state = false;
  bool download_state = false;
  Duration state_download_timeout = 15s;
  // Replica averaging (needs a directory; 0: off): every `average_period`, at the same
  // wall-clock instants on every server (multiples of the period), each expert served by
  // more than one server (replicas found through its DHT declarations) averages its
  // parameters with those replicas by the butterfly all-reduce (averaging/averager.hpp; key
  // prefix "moe-avg.<uid>", round "params/<k>", expected group size = the declared
  // replicas), each round bounded by `average_timeout`. The parameters are snapshotted and
  // written back by the runtime thread; an expert that stepped between the two keeps its
  // progress (it adds mean - snapshot). Optimizer state is not averaged. Every replica of a
  // uid must run with the same period.
  Duration average_period = Duration::zero();
  Duration average_timeout = 15s;
  // Optimizer steps. 0: one step per backward batch (Learning@home). N > 0 (SWARM): the
  // gradients of backward batches accumulate and the expert steps once N rows have been
  // backpropagated since its last step (the step applies the sum of the accumulated
  // gradients, as if those rows had come in one batch), or once the first accumulated
  // gradient is `max_step_delay` old (zero: no time bound). stop() applies the gradients
  // accumulated but not yet applied in one last step of each expert (stats.final_steps)
  // before the final checkpoint, within stop_timeout (past it they are dropped, logged).
  std::uint64_t step_samples = 0;
  Duration max_step_delay = Duration::zero();
  // Staleness bound: a backward whose forward answer is more than this many optimizer steps
  // old (the request's forward_step), or from a step the expert has not reached (a restart
  // from an older checkpoint), is refused (stats.stale_gradients). Not checked for a request
  // without forward_step, nor with the default (no bound).
  std::uint64_t max_staleness = std::numeric_limits<std::uint64_t>::max();
};

struct ExpertServerStats {
  std::atomic<std::uint64_t> forward_batches{0}, forward_rows{0};
  std::atomic<std::uint64_t> backward_batches{0}, backward_rows{0};
  std::atomic<std::uint64_t> optimizer_steps{0};
  std::atomic<std::uint64_t> bad_requests{0}, refused{0}, expired{0};
  std::atomic<std::uint64_t> declarations{0}, declare_failures{0};
  std::atomic<std::uint64_t> checkpoints_saved{0}, checkpoints_loaded{0}, checkpoint_failures{0};
  std::atomic<std::uint64_t> injected_failures{0};
  std::atomic<std::uint64_t> states_shared{0}, states_downloaded{0}, state_failures{0};
  std::atomic<std::uint64_t> stale_gradients{0};
  std::atomic<std::uint64_t> streamed_calls{0};  // streamed requests received whole
  std::atomic<std::uint64_t> final_steps{0};     // steps stop() took on accumulated gradients
  std::atomic<std::uint64_t> replica_averages{0}, average_failures{0};  // rounds of an expert
};

class ExpertServer : public std::enable_shared_from_this<ExpertServer> {
 public:
  // `directory` may be null (no declarations: clients are given the address directly).
  static std::shared_ptr<ExpertServer> create(std::shared_ptr<net::Host> host,
                                              std::shared_ptr<averaging::Directory> directory,
                                              ExpertServerConfig config = {});
  ~ExpertServer();

  // Before start(). errc::already_exists for a duplicate uid, invalid_argument for a bad one.
  result<void> add_expert(const std::string& uid, ExpertModule module, const OptimizerFactory& opt);

  // Registers the RPC methods, starts the runtime thread, declares the experts once (a
  // failed first declaration is logged, not fatal) and starts the re-declaring task.
  awaitable<result<void>> start();
  // Unregisters the methods, fails queued requests, stops the declaring task and joins the
  // runtime thread after its running batch, the last steps on accumulated gradients and the
  // final checkpoints (bounded by stop_timeout:
  // past it the thread is detached and finishes on its own).
  awaitable<void> stop();

  std::vector<std::string> uids() const;
  const ExpertServerStats& stats() const noexcept { return *stats_; }
  // The expert's module (for tests that compare with a local copy). Only while stopped or
  // when no request runs.
  std::shared_ptr<torch::nn::Module> module_of(const std::string& uid) const;
  // The expert's optimizer (same rule as module_of).
  torch::optim::Optimizer* optimizer_of(const std::string& uid) const;
  // Optimizer steps the expert has taken, including those restored from its checkpoint.
  std::uint64_t steps_of(const std::string& uid) const;
  // Path of the expert's checkpoint file in `dir`.
  static std::filesystem::path checkpoint_path(const std::filesystem::path& dir,
                                               const std::string& uid);
  // Declares now (also done periodically after start()).
  awaitable<result<void>> declare_now();

  struct Impl;

 private:
  ExpertServer() = default;
  std::shared_ptr<Impl> impl_;
  std::shared_ptr<ExpertServerStats> stats_;
};

}  // namespace starling::moe
