// `starling train`: its options (flags and --config FILE) and the pieces of the command that
// do not need torch (option parsing, the networked collaboration). cmd_train.cpp is the only
// CLI translation unit that includes torch.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "starling/averaging/robust.hpp"
#include "starling/monitor/aggregator.hpp"
#include "starling/monitor/metrics_record.hpp"
#include "starling/optim/optimizer_options.hpp"
#include "starling/training/collaboration.hpp"

namespace starling::net {
class Host;
}
namespace starling::dht {
class DhtNode;
}

namespace starling::cli {

struct TrainOptions {
  std::string identity;                    // identity key file (created if missing)
  std::vector<std::string> initial_peers;  // multiaddrs of peers (or a bootstrap node) to join
  std::vector<std::string> listen{"/ip4/0.0.0.0/tcp/0"};
  std::string directory;  // FileDirectory root shared by processes on one machine
  std::string run_id;     // "": fashion-mnist, or wordnet-lm with --task lm
  std::uint64_t target_batch_size = 1024;
  std::size_t batch_size = 64;
  int threads = 1;
  std::string max_bandwidth = "0";  // bytes/s, with an optional k/M/G suffix; 0: unlimited
  std::string checkpoint_dir;
  std::uint32_t diloco_steps = 0;
  double outer_lr = 0.7;        // DiLoCo outer step (OuterOptions)
  double outer_momentum = 0.5;  // Nesterov (the library's default is 0.9; docs/training.md)
  std::string config;
  // The built-in task.
  std::string task = "fashion";    // fashion (Fashion-MNIST) | lm (language model on WordNet)
  std::string model;               // "": mlp (fashion) or tiny (lm)
  std::string optimizer = "adam";  // adam | lamb
  double lr = 1e-3;
  double weight_decay = 0.01;       // lamb
  double max_grad_norm = 0;         // lamb: clip the averaged gradient (0: no clipping)
  std::uint64_t warmup_epochs = 0;  // lamb: linear warm-up over these collaboration epochs
  std::uint64_t decay_epochs = 0;   // lamb: cosine decay to 0.1 lr until this epoch (0: none)
  std::uint32_t vocab_size = 2048;  // lm: BPE vocabulary
  std::string cache_dir;            // lm: tokenizer cache ("": ~/.cache/starling)
  std::size_t eval_windows = 128;   // lm: held-out windows evaluated (0: all)
  std::string data_dir;
  // fashion-moe: the experts' grid (PREFIX.N.M), their width, experts per sample, deadline
  // of one forward / backward (seconds) and test samples evaluated.
  std::string moe_grid = "ffn.4.4";
  std::int64_t moe_dim = 64;
  std::size_t moe_k = 4;
  double moe_timeout = 5;
  std::size_t moe_eval_samples = 10000;
  std::uint64_t model_seed = 0;  // peers must agree (same initial parameters)
  std::uint64_t data_seed = 0;   // 0: derived from the identity (each peer its own stream)
  std::string compression = "none";
  std::string aggregation = "mean";
  double clip_tau = 0;                                   // CenteredClip radius (0: adaptive)
  double clip_cut = averaging::AggregationConfig{}.cut;  // AggregationConfig::cut
  // testing robustness: none | sign-flip | random | alie | label-flip | stall | flood | stale |
  // inflated | wrong-average | different-parts | false-report | directory-lie
  std::string attack = "none";
  bool verify = false;  // accountability (docs/security.md)
  // Gradient check (docs/security.md "Gradient check"): members drawn per round whose
  // contribution every member re-computes (0: off; needs --verify, task fashion)
  std::uint32_t grad_check = 0;
  double grad_check_tol = 1e-3;
  // A private run: the run key (starling run-key new), this peer's certificate file
  // (starling run-key sign) and optionally a revocation list to publish (run-key revoke).
  std::string run_key, membership, revocations;
  bool delay_step = false;
  std::string delay_correction = "local";
  double max_backlog = 0;
  double worker_momentum = 0;         // OptimizerOptions::worker_momentum (inner beta1 then 0)
  bool client = false;                // no incoming connections
  bool relay = false;                 // serve circuit relay v2 and AutoNAT to other peers
  bool use_relays = false;            // reachable through relay reservations with the initial peers
  bool hole_punching = false;         // DCUtR: upgrade relayed connections to direct ones
  bool allow_private = false;         // labs: AutoNAT and DCUtR accept private addresses
  std::string port_mapping = "auto";  // auto | pcp | natpmp | upnp | off (home router forwarding)
  bool auxiliary = false;             // averages without computing
  // When to stop (0: never; Ctrl-C always works).
  std::uint64_t max_epochs = 0;   // the collaboration reached this epoch
  std::uint64_t max_samples = 0;  // this peer contributed this many samples
  double max_seconds = 0;
  double linger = 30;  // networked: seconds to keep serving state to peers behind at the end
  std::uint64_t eval_every = 0;  // evaluate on the test set every N epochs (0: only at the end)
  // Time to accuracy: the first evaluation at or above this (0: none) is reported (seconds,
  // epoch); with stop_at_target the trainer stops there.
  double target_accuracy = 0;
  bool stop_at_target = false;
  std::string eval_pause_file;  // benchmarks: processes stopped while evaluating
  std::string start_barrier;    // benchmarks: wait for DIR/go before starting the clock
  double progress_every = 2;    // seconds between progress lines when stderr is not a tty
  std::string report;           // write a JSON summary here at the end
  double averaging_timeout = 30;
  double matchmaking_time = 2;
  double startup_grace = 0.5;  // ProgressConfig::startup_grace_min (0: --matchmaking-time)
  // Run metrics: a signed record in the DHT every interval (networked only), unless
  // --no-metrics; `--metrics HOST:PORT` also serves Prometheus text on http://HOST:PORT/metrics.
  std::string metrics = "on";
  bool no_metrics = false;
  double metrics_interval = 10;
  std::string name;  // display name in the record (sanitized, at most 32 bytes)
};

// Registers the flags on `cmd` (defaults from `o`).
void add_train_flags(CLI::App& cmd, TrainOptions& o);
// Fills the task-dependent defaults (run id, model) and checks --task / --optimizer.
result<void> resolve_task_defaults(TrainOptions& o);
// Applies --config FILE (a JSON object whose keys are long flag names without the dashes,
// e.g. {"target-batch-size": 2048}) to the flags not given on the command line. Errors name
// the file and the key.
result<void> apply_train_config(CLI::App& cmd, const std::string& path);
// "0", "12500000", "10M", "1.5k" (bytes/s; k = 1e3) -> bytes/s.
result<std::uint64_t> parse_bandwidth(const std::string& s);
// Whether the trainer publishes metrics records, and the Prometheus address ("" if none).
bool metrics_enabled(const TrainOptions& o);
std::string metrics_http_address(const TrainOptions& o);
// The optimizer options the flags describe (validated).
result<optim::OptimizerOptions> optimizer_options(const TrainOptions& o);

// The networked side of a trainer: node, averaging, directory. Null collaboration when the
// peer trains alone (no --initial-peers, no --directory).
class TrainNetwork {
 public:
  virtual ~TrainNetwork() = default;
  // Networked: the node's host and DHT (used on the host's executor); alone: null.
  virtual std::shared_ptr<net::Host> host() { return nullptr; }
  virtual std::shared_ptr<dht::DhtNode> dht() { return nullptr; }
  virtual std::shared_ptr<training::Collaboration> collaboration() = 0;
  virtual std::string peer_id() const = 0;
  // Stops the node (bounded).
  virtual void stop() = 0;
  // Bytes sent and received by the collaboration (rounds and state transfer); after stop()
  // the totals at the time it stopped.
  virtual std::pair<std::uint64_t, std::uint64_t> traffic() { return {0, 0}; }
  // Listen addresses (with /p2p/<id>) others can bootstrap through.
  virtual std::vector<std::string> addresses() const { return {}; }
  // Networked with --metrics: hands the newest metrics record to the publisher (it publishes
  // at most every --metrics-interval, without blocking the caller). Else ignored.
  virtual void publish_metrics(monitor::MetricsRecord) {}
  // Networked: reads the run's live metrics records and refuses (errc::invalid_argument, with
  // a message naming the peer and both identities) if one carries another task identity
  // (TrainTask::identity(): data, vocabulary, model, optimizer). Peers that publish no record
  // (--no-metrics) are not checked. Alone: nothing to check. `own_uptime_s` > 0 (the periodic
  // check while training): only a peer that has run longer counts (monitor::
  // older_identity_conflict), so of two mismatched trainers the younger leaves.
  virtual result<void> check_run_identity(const std::string& identity, double own_uptime_s = 0) {
    (void)identity;
    (void)own_uptime_s;
    return success();
  }
};
// While training: re-checks the run's task identities every `every` on a thread of its own
// (one DHT read, bounded by 15 s), with this peer's uptime, so that two mismatched trainers
// started in the same second (each saw no record of the other at start) do not both stay:
// poll() returns the refusal once a peer that joined earlier is found to train something else.
// A failed read is not a refusal. The destructor waits for a read in flight (bounded).
class IdentityWatch {
 public:
  IdentityWatch(TrainNetwork& net, std::string identity, Duration every);
  ~IdentityWatch();
  IdentityWatch(const IdentityWatch&) = delete;
  IdentityWatch& operator=(const IdentityWatch&) = delete;
  std::optional<Error> poll();

 private:
  TrainNetwork& net_;
  std::string identity_;
  Duration every_;
  TimePoint start_;
  TimePoint next_;
  std::future<result<void>> pending_;
};
// The check itself, on records already read (`self` is skipped).
result<void> check_run_identity(const std::vector<monitor::MetricsEntry>& entries,
                                const net::PeerId& self, const std::string& run_id,
                                const std::string& identity, double own_uptime_s = 0);
result<std::unique_ptr<TrainNetwork>> start_train_network(const TrainOptions& o);

}  // namespace starling::cli
