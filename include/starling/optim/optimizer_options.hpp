// Options, per-step reports and status of starling::Optimizer (optimizer.hpp), without torch,
// so configuration code (the CLI, config files) and the io-thread half can use them cheaply.
//
// Threading rule: plain values.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "starling/training/collaboration.hpp"
#include "starling/training/progress.hpp"

namespace starling::optim {

// DiLoCo's outer optimizer: SGD with (Nesterov) momentum on the averaged pseudo-gradient.
struct OuterOptions {
  double lr = 0.7;        // DiLoCo's default outer learning rate
  double momentum = 0.9;  // DiLoCo's default
  bool nesterov = true;
};

// How delayed updates correct for the staleness of their gradients (see
// OptimizerOptions::delay_correction).
enum class DelayCorrection { none, predict, local };
result<DelayCorrection> parse_delay_correction(const std::string& s);
const char* to_string(DelayCorrection c);

struct OptimizerOptions {
  // Name of the collaboration; DHT keys and averaging groups derive from it. Required.
  std::string run_id;
  // Samples the whole collaboration accumulates per optimizer step (the global batch).
  std::uint64_t target_batch_size = 4096;
  // Samples per step() call when step() is called without a count (0: the count is required).
  std::size_t batch_size = 0;

  // Matchmaking for an averaging round starts this long before the estimated time the target
  // is reached, so the group is ready when it is.
  Duration matchmaking_time = 5s;
  // An averaging round (matchmaking + all-reduce) that takes longer fails; the peer keeps its
  // gradients and retries (see step()).
  Duration averaging_timeout = 30s;
  // Downloading state from peers gives up after this.
  Duration load_state_timeout = 120s;
  // After a failed round or state download, the peer waits this long before trying again.
  Duration retry_backoff = 2s;
  // Consecutive failed rounds after which a peer that is confirmed alone steps with its own
  // gradients (with live peers at its epoch it keeps trying: stepping alone would fork).
  std::uint32_t max_failed_rounds = 3;
  // How long the training thread waits for the node's io thread beyond an operation's own
  // deadline before giving up on it (the io thread is stopped or wedged).
  Duration io_grace = 30s;

  // Wire compression of gradients (or DiLoCo pseudo-gradients) and of parameters/optimizer
  // state (state averaging and state download).
  training::Compression grad_compression = training::Compression::none;
  training::Compression state_compression = training::Compression::none;

  // Delayed parameter updates: the averaging round and the optimizer step run in the
  // background while the next gradients are computed (on parameters one step old); the step
  // is applied at the next step() call. Hides network time behind compute: step() never waits
  // for the round in flight; the samples computed meanwhile all go into the next round (so a
  // round slower than an epoch's compute makes the steps larger, not the loop slower).
  bool delay_optimizer_step = false;
  // The correction of delayed updates' staleness. The collaboration's state (digests, state
  // served to peers, checkpoints, Optimizer::with_collaboration_parameters) is always the
  // parameters the rounds' averages were applied to ("master"), identical on every peer; only
  // where the training thread computes gradients changes:
  //  - `local`: when a round starts, each peer applies its own gradient of that round (the
  //    contribution it sends) to master at once, with the inner optimizer and its state as they
  //    are (a preview: neither master nor the optimizer state changes), and computes the next
  //    gradients there; when the round ends, the collaboration's average replaces that local
  //    step (the model gets master, now stepped by the average). The gradients of the next
  //    round are thus taken one local step ahead, near where they are applied.
  //  - `predict` (weight prediction): at master extrapolated by the last step
  //    (master + (master - previous master)), an estimate of where the round in flight will
  //    leave it.
  //  - `none`: at the last applied parameters (one step stale).
  DelayCorrection delay_correction = DelayCorrection::local;
  // Delayed updates: once this peer has computed this many targets' worth of its share
  // (target_batch_size / live computing peers) while a round is in flight, step() waits for
  // that round (serving state requests meanwhile) instead of computing on. A round shorter than
  // that much computing never makes the loop wait (delayed steps); a longer one makes it wait
  // like a synchronous step, with one share of computing overlapped, rather than grow every
  // epoch to many targets of samples. 0: never wait.
  double delay_max_backlog = 0;

  // Worker momentum (Karimireddy et al. 2021, "Learning from History for Byzantine Robust
  // Optimization"): if > 0, each peer contributes to a round the exponential moving average
  // of its own mean gradients (m = worker_momentum x m + (1 - worker_momentum) x g, bias-
  // corrected, committed once the round's result is applied) instead of the gradient itself.
  // The honest contributions then differ by far less than single gradients do, which leaves a
  // hostile minority's shift that hides inside their spread ("a little is enough") much less
  // room under CenteredClip (docs/security.md). With the mean (every peer in every round, equal
  // weights) it is the inner optimizer's first moment moved before the average: give the inner
  // optimizer none (Adam beta1 = 0; `starling train --worker-momentum` does). The average is
  // the peer's own: not in the state or checkpoints (a restarted or new peer begins a new
  // one). Not with DiLoCo.
  double worker_momentum = 0;

  // The inner optimizer's state is not in the state format's optimizer section: its tensors
  // are buffers of the model (the Python binding registers a Python optimizer's state tensors
  // there), so state transfer and checkpoints carry them with the model. The inner optimizer
  // may then be of any type (the Python binding's adapter calls the Python optimizer's
  // step()). Not with delay_optimizer_step (the background step runs on another thread).
  bool optimizer_state_in_model = false;

  // This peer accepts no incoming connections (behind NAT); it still averages and serves
  // state over its own outgoing connections.
  bool client_mode = false;
  // This peer computes no gradients: it only helps averaging (weight 0). It calls
  // Optimizer::assist() in a loop instead of step(), and serves no state. (Bandwidth limits are
  // the node's: collab::TrainingNodeConfig::max_upload/download_bytes_per_second.)
  bool auxiliary = false;

  // DiLoCo: if > 0, the inner optimizer steps on every step() call (local updates) and every
  // outer round averages pseudo-gradients (start-of-round parameters minus current ones) and
  // applies the outer Nesterov step. A round ends when the collaboration has done H local
  // steps per computing peer on average, that is when it has accumulated
  // H * batch_size * (computing peers) samples; target_batch_size is not used.
  std::uint32_t diloco_steps = 0;
  OuterOptions outer;

  // Checkpoints: if set, the state is saved there every `checkpoint_every` epochs (and at
  // shutdown), and create() resumes from the newest valid checkpoint found there.
  std::filesystem::path checkpoint_dir;
  std::uint32_t checkpoint_every = 10;
  std::size_t checkpoints_kept = 2;

  // Progress record lifetime in the DHT and the estimator's tuning (see ProgressConfig; its
  // target, matchmaking time, auxiliary/client flags are filled from the fields above).
  Duration progress_ttl = 60s;
  training::ProgressConfig progress;

  // Training thread: if set, polled every 20 ms while step() or load_state_from_peers() waits
  // for the io thread (a round, a download); returning true abandons that wait
  // (errc::cancelled; the round fails, as one that timed out). The Python binding checks for
  // Ctrl-C here, so that KeyboardInterrupt is raised within ~20 ms instead of at the end of the
  // round.
  std::function<bool()> interrupted;

  // Gradient check (docs/security.md "Gradient check"; the collaboration draws the members,
  // collab::NetCollaborationConfig::grad_check_targets): called on the training thread after a
  // successful round and before its result is applied (the parameters are still the epoch's),
  // once per drawn member whose values this peer holds, with the round's epoch. Returns why
  // the member's values differ from the re-computation (it is then banned here:
  // Collaboration::convict), nullopt when they match. Synchronous gradient steps only.
  std::function<std::optional<std::string>(const training::ContributionSample&, std::uint64_t)>
      check_contribution;
};

// Validates options: run_id set, target > 0, timeouts > 0, stale_after > publish interval...
result<void> validate(const OptimizerOptions& options);

// What one step() call did.
struct StepReport {
  training::Action action = training::Action::accumulate;
  bool stepped = false;          // an optimizer step (or outer step) was applied
  std::uint64_t epoch = 0;       // local epoch after the call
  std::size_t group_size = 0;    // peers in the averaging round (1 when alone)
  double group_samples = 0;      // samples the applied step averaged over
  std::uint64_t bytes_sent = 0;  // by this call's round
  std::uint64_t bytes_received = 0;
  Duration averaging_time{0};
  // Of a completed round (zero otherwise): forming the group, and the all-reduce itself.
  Duration matchmaking_time{0};
  Duration allreduce_time{0};
  // Delayed updates: a round (and its step) runs in the background after this call; the step
  // is applied by a later call (stepped = true then).
  bool round_in_background = false;
  std::optional<Error> round_error;  // a failed round (the step was retried or skipped)
};

// A snapshot for progress lines and statistics.
struct OptimizerStatus {
  std::uint64_t local_epoch = 0;
  std::uint64_t local_samples = 0;  // toward the current epoch
  std::uint64_t samples_total = 0;  // this peer's contribution over the run
  double local_samples_per_second = 0;
  training::CollaborationView collaboration;
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t rounds_ok = 0;
  std::uint64_t rounds_failed = 0;
  // Rounds this peer joined because another member of the prepared group sent its data first
  // (before its own view of the progress counted the target reached).
  std::uint64_t rounds_joined_early = 0;
  std::uint64_t state_downloads = 0;
  // Samples this peer computed that went into no round: accumulated toward an epoch the
  // collaboration left without it (dropped when the state download replaced that epoch).
  std::uint64_t samples_dropped = 0;
  // Wall time the training thread spent inside step() (accumulating, and waiting for
  // synchronous rounds, state downloads and applying steps): what the collaboration costs the
  // training loop.
  Duration step_time{0};
  // Gradient check (OptimizerOptions::check_contribution): members checked, those whose values
  // differed, and the training thread's time spent re-computing.
  std::uint64_t grad_checks = 0;
  std::uint64_t grad_check_failures = 0;
  Duration grad_check_time{0};
};

}  // namespace starling::optim
