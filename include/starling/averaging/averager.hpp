// Averager: decentralized averaging of named float32 tensors with whoever is there. step()
// finds a group through the directory (DHT), runs the fault-tolerant butterfly all-reduce over
// libp2p streams, and writes the group's weighted mean back into the tensors. It also serves
// and downloads state for newcomers (state_transfer.hpp).
//
// Threading rule: an Averager lives on its host's executor (one I/O thread); call its
// coroutines from there (blocking wrappers: blocking_step()). Reductions run on a small worker
// pool, never on the I/O thread. The tensors passed at construction must stay alive; step()
// reads them when it starts and writes them only when it succeeds. An averager created without
// tensors takes each step's data as one flat buffer instead (StepData): no copies at all.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "starling/averaging/ban_list.hpp"
#include "starling/averaging/directory.hpp"
#include "starling/averaging/grad_check.hpp"
#include "starling/averaging/group_key.hpp"
#include "starling/averaging/matchmaking_core.hpp"
#include "starling/averaging/peer_gate.hpp"
#include "starling/averaging/round_core.hpp"
#include "starling/averaging/schema.hpp"
#include "starling/averaging/state_transfer.hpp"
#include "starling/averaging/wire.hpp"
#include "starling/net/stream_host.hpp"

namespace starling {
class ThreadPool;
}

namespace starling::averaging {
namespace detail {
class MatchSession;
class RoundRunner;
struct RoundAcctConfig;
}  // namespace detail

// Accountability (docs/security.md): every round's statements are signed and checked, the
// owners' results pass the aggregation check after the all-gather, evidence bans the cheater
// (BanList) and goes to the directory as an accusation that every peer of the run verifies.
// Banned peers are left out of matchmaking. Every peer of a run must use the same setting
// (the protocol ids differ); parts must be uncompressed (schema codec "none").
struct AccountabilityConfig {
  bool enabled = false;
  // The identity key that signs (default: the host's when it is a net::Host).
  std::optional<crypto::KeyPair> key;
  std::string run = "starling";  // the run's name: evidence about other runs is refused
  acct::CheckConfig check;       // its aggregation fields are taken from the round's
  Duration grace = 20s;          // a wrong_average verdict waits this long for an answer
  Duration record_ttl = 3600s;   // accusations stay in the directory this long
  // A ban list shared with other averagers of the run (null: the averager makes its own).
  std::shared_ptr<acct::BanList> bans;
  // FOR TESTING the defence: an owner that shifts its results, a member that sends the next
  // member's parts other values than it committed, or one that lies in its projection reports
  // about the other owners' parts (to get them banned); directory_lie: one that reports
  // honestly in the round but publishes, for every part another member owns, a wrong_average
  // accusation built from a lying report of its own (the owner never sees it in the round).
  enum class Attack : std::uint8_t {
    none,
    wrong_average,
    different_parts,
    false_report,
    directory_lie
  };
  Attack attack = Attack::none;
  // Gradient check (grad_check.hpp): after each checked round, the members drawn from its
  // seed (this many, distinct; 0: no check) are this member's targets: StepResult::
  // grad_samples holds their values on the parts this member owns, for the caller to
  // re-compute.
  std::uint32_t grad_check_targets = 0;
};

struct AveragerConfig {
  GroupKeyConfig key;  // prefix (required), Moshpit grid and dims
  MatchmakingConfig matchmaking;
  RoundConfig round;                          // part size, stall timeout (inline_reduce is ignored)
  std::uint64_t bandwidth = 100'000'000 / 8;  // declared bytes/s (used to split shares)
  // A round's uploads (all its streams together) are paced at this fraction of `bandwidth`
  // in bursts of at most `upload_burst` bytes, so the queue stays in this process, where the
  // round balances its flows, rather than in the link's buffer (0: not paced). Declare the
  // real uplink: a lower `bandwidth` slows rounds down.
  double upload_pace = 0.94;
  std::size_t upload_burst = 64 * 1024;
  bool client_mode = false;  // cannot accept streams: send and receive, own no share
  // Asked at each step's matchmaking and each state announcement (on the host's executor):
  // true = take part as a client member this time, as client_mode does (e.g. a peer that
  // AutoNAT found not publicly reachable, whose inbound streams would need a relay). Null:
  // client_mode alone decides.
  std::function<bool()> client_now;
  std::vector<std::string> addrs;    // addresses others dial (multiaddr strings)
  Duration keepalive_interval = 1s;  // on every all-reduce stream while a round runs
  Duration open_timeout = 10s;       // opening a stream to a group member
  Duration stop_timeout = 5s;        // stop(): the longest wait for a step in flight to end
  std::size_t reduce_threads = 2;    // worker pool for reductions and (de)compression
  // Error feedback for lossy codecs: what compression lost in one step is added to this
  // peer's values in the next step it sends them, so the error does not accumulate.
  bool error_feedback = false;
  std::uint64_t seed = 0;  // for group ids and initial Moshpit digits (0: random)
  // Intact groups skip the DHT: when a step expects exactly the members of this peer's last
  // successful group (StepOptions::expected_group_size == its size, one key per prefix), the
  // members match over their connections from a view predicted from that group, and fall back
  // to the DHT after matchmaking.refresh_interval without a group (docs/averaging.md).
  bool reuse_group = true;
  // Part size of blob snapshots (share_blob / blob sources); tensor snapshots use round.part_elems.
  std::size_t blob_part_bytes = 256 * 1024;
  // Private runs: only peers this gate admits are matched with, joined, grouped with, served
  // state or downloaded from (auth::MembershipService). Null: an open run.
  std::shared_ptr<PeerGate> gate;
  AccountabilityConfig accountability;
  // Test hook: called on the I/O thread when this peer's step enters a phase
  // ("matchmaking:<state>", "reduce-scatter", "report", "all-gather", "fin", "done").
  std::function<void(const std::string& phase)> on_phase;
  // FOR TESTING only (`starling train --attack stall`): after joining a group this peer opens
  // its streams and sends its hellos, then nothing (no parts, results or keepalives); the
  // others drop it once it is silent for the round's stall_timeout.
  bool test_stall = false;
};

struct StepOptions {
  double weight = 1.0;  // this peer's contribution weight (e.g. samples)
  // The round's name (e.g. "grads/12"): only peers stepping with the same round (and group key)
  // are matched, so peers at different epochs never average together. Empty: the averager's
  // key alone. Printable ASCII without '[' or ']', at most 128 characters.
  std::string round;
  Duration timeout = 60s;  // the whole step (matchmaking + all-reduce) ends by then
  // Matchmaking must form a group within this (default: half the timeout, at most 30 s).
  std::optional<Duration> matchmaking_timeout;
  // Overrides the config's minimum group size for this step (e.g. a majority of the peers
  // known to take part, so that two disjoint groups cannot both form).
  std::optional<std::size_t> min_group_size;
  // The number of peers expected in this round, this one included, when the caller knows it
  // (MatchmakingConfig::expected_size): a leader holding that many begins at once instead of
  // after min_wait. Never count low: a peer joining after the leader began is left out.
  std::optional<std::size_t> expected_group_size;
  // Whether this step may match from the last group without the DHT when it expects exactly
  // its members (AveragerConfig::reuse_group). The caller says false when a peer outside the
  // expected ones may join (e.g. it is catching up) and must find the round in the directory.
  bool reuse_group = true;
  // Skip matchmaking and average with exactly this group (tests, benchmarks, fixed clusters).
  std::optional<GroupInfo> group;
  // begin() only: the data must be supplied (PendingStep::run()) within this of begin();
  // default: half the timeout. Past it this member leaves its group (the others drop it like a
  // lost peer) and the step fails with errc::timeout. Clamped to the step's timeout.
  std::optional<Duration> data_timeout;
};

struct MemberContribution {
  PeerKey peer;
  double weight = 0;
  bool client = false;
  std::uint64_t counted_elements = 0;  // elements of the result that include its values
};

struct StepResult {
  GroupInfo group;
  std::uint32_t my_index = 0;
  std::vector<MemberContribution> contributions;
  std::uint32_t subrounds = 1;  // > 1 when parts were re-reduced after failures
  // This peer's matchmaking used no directory operation (AveragerConfig::reuse_group; a
  // follower of a leader that fell back to the directory still says true).
  bool matched_directly = false;
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  Duration matchmaking_time{}, allreduce_time{}, total_time{};
  Duration codec_time{};  // worker-thread time spent encoding and decoding (compressed schemas)
  // The round's time line: this member's data came `data_wait` after the group formed (its
  // computing, when the group formed early); the inputs of the parts it owns (the others'
  // data) `peer_wait` after that; the round was done `exchange_time` after both; closing its
  // streams took `close_time`.
  Duration data_wait{}, peer_wait{}, exchange_time{}, close_time{};
  // Accountability: parts that passed or failed the aggregation check here, and evidence found.
  std::size_t checked_parts = 0, evidence_found = 0;
  // Gradient check (AccountabilityConfig::grad_check_targets): the drawn targets' values on
  // this member's parts (none if the round was not checked or it owns none of theirs).
  std::vector<ContributionSample> grad_samples;
};

// A state blob as a donor serves it: the epoch (newer wins) and the bytes.
struct BlobSnapshot {
  std::uint64_t epoch = 0;
  Bytes data;
  Bytes metadata;  // <= 64 KiB
};

struct BlobState {
  StateInfo info;
  Bytes data;
};

// A step's data as one flat buffer in the schema's order, instead of the averager's own
// tensors: `input` (this member's values) is read when the data is supplied, and the group's
// average is written into `output` by the round as it arrives (its content is unspecified if
// the step fails). The round reads and writes these buffers directly (compressed schemas
// encode and decode on the worker pool): nothing is copied. `owner` keeps both alive until the
// step is over, even if the caller stopped waiting for it.
struct StepData {
  std::span<const float> input;
  std::span<float> output;
  std::shared_ptr<const void> owner;
};

class Averager;

// A step whose matchmaking started before its data was ready (Averager::begin()). The group
// forms (and the round's streams open) in the background; run() supplies this member's data.
// Until then the others wait for it like for a slow member (this member sends keepalives),
// never past its data deadline: a member whose data does not come leaves, and the others
// finish without it.
//
// Threading rule: run() and cancel() on the averager's executor; run_blocking() from any
// other thread. Keep the handle until run() returns (dropping it does not cancel the step).
class PendingStep {
 public:
  struct State;
  explicit PendingStep(std::shared_ptr<State> st) : st_(std::move(st)) {}

  // Supplies the data: the averager's tensors are read now, with `weight` (finite, >= 0),
  // then waits for the round and returns its result (on error the tensors are unchanged).
  // At most once. If the step already failed (no group, data deadline passed, cancelled)
  // that error is returned at once.
  awaitable<result<StepResult>> run(double weight);
  result<StepResult> run_blocking(double weight);
  // The same with the data in `data` (sizes: the schema's numel) instead of the tensors.
  awaitable<result<StepResult>> run(double weight, StepData data);
  // This member will not supply data, and cancel() returns at once: still matchmaking, it
  // stops (a follower sends its leader Leave, a leader sends its followers Disband); grouped,
  // it leaves the round; the step then ends within moments. A later run() returns
  // errc::cancelled. Executor thread.
  void cancel();
  // As cancel(), and a round that has this member's data is abandoned too (Averager::stop()).
  void end(const std::string& why);
  // Waits until the step is over (finished()) or `until` passes; false if it is still running
  // then (or the wait was cancelled).
  awaitable<bool> wait(TimePoint until);
  // The group has formed (this member is in a round, waiting for data or running).
  bool grouped() const;
  // `f` runs (executor thread) once another member's data arrives while this member's is
  // still pending: the others reached the target, so supplying the data now ends the wait.
  void on_peer_data(std::function<void()> f);
  // Another member's data arrived before this member's (see on_peer_data()).
  bool peer_data() const;
  // The step is over (run() would return at once).
  bool finished() const;

 private:
  std::shared_ptr<State> st_;
};

// Protocol ids are per averager: the base id followed by "/" and the key prefix, so several
// averagers (gradients and state, or several runs) share one host.
std::string averaging_protocol(const char* base, const std::string& prefix);

class Averager : public std::enable_shared_from_this<Averager> {
 public:
  // `add_addresses` lets the averager tell the transport where group members listen
  // (net::Host::add_addresses); may be empty if the transport finds peers itself.
  using AddressSink =
      std::function<void(const net::PeerId&, const std::vector<std::string>& addrs)>;

  // `tensors`: views matching the schema, or none (every step brings a StepData; the state
  // transfer of tensors, share_state() / load_state(), then refuses with invalid_argument).
  static result<std::shared_ptr<Averager>> create(std::shared_ptr<net::StreamHost> host,
                                                  std::shared_ptr<Directory> directory,
                                                  Schema schema, std::vector<TensorView> tensors,
                                                  AveragerConfig cfg,
                                                  AddressSink add_addresses = {});
  ~Averager();

  // Registers the protocol handlers. Call once before step().
  void start();
  // Unregisters handlers and waits (bounded) for background work.
  awaitable<void> stop();

  // One averaging step. Errors: errc::timeout (no group before the matchmaking deadline, or the
  // round did not finish), errc::unavailable (the group lost this peer), invalid_argument.
  // On error the tensors are unchanged.
  awaitable<result<StepResult>> step(StepOptions opts);
  awaitable<result<StepResult>> step(StepOptions opts, StepData data);
  // Early matchmaking: starts matchmaking for `opts` now, in the background, without the
  // data; PendingStep::run(weight) supplies it later (see PendingStep). opts.weight is only
  // sent in the join request (others report it for this member if they never learn the real
  // one). step(opts) is begin(opts) followed by run(opts.weight). Errors: another step is
  // running (errc::already_exists), invalid options. Executor thread.
  result<std::shared_ptr<PendingStep>> begin(StepOptions opts);

  // --- state transfer ---------------------------------------------------------------------
  // One averager serves one snapshot at a time (the newest share_*() call or source answer),
  // plus the previous one while downloads of it finish.
  //
  // Donor side of state transfer: snapshots the tensors now, with `epoch` and `metadata`
  // (<= 64 KiB), serves that snapshot to newcomers until the next call, and announces it in the
  // directory for `ttl`.
  awaitable<result<void>> share_state(std::uint64_t epoch, Bytes metadata, Duration ttl = 300s);
  // Newcomer side: downloads the best announced snapshot (highest epoch, most donors) from
  // several donors in parallel, verifying every part, and writes it into the tensors. Errors:
  // errc::not_found (nobody announces a state with this schema), unavailable (every donor
  // failed), timeout. On error the tensors are unchanged.
  awaitable<result<StateInfo>> load_state(LoadStateOptions opts = {});

  // Blobs: arbitrary bytes (a model and its optimizer state) up to LoadStateOptions::max_bytes,
  // in parts of cfg.blob_part_bytes, each hashed, fetched from several donors and resumed from
  // another donor when one fails. share_blob() snapshots `blob` and announces it for `ttl`.
  awaitable<result<void>> share_blob(BlobSnapshot blob, Duration ttl = 300s);
  // Lazy donor: on every manifest request the averager asks `source` (bounded) for the current
  // state and serves it; the same epoch and size as the current snapshot reuses it. Call
  // announce_blob() (periodically, before ttl ends) to be found. nullptr stops serving.
  using BlobSource = std::function<awaitable<result<BlobSnapshot>>()>;
  void set_blob_source(BlobSource source);
  awaitable<result<void>> announce_blob(std::uint64_t epoch, Duration ttl = 300s);
  // Newcomer side: the blob with the highest epoch held by the most donors. Errors as
  // load_state(); errc::too_large when the donors' blob exceeds opts.max_bytes.
  awaitable<result<BlobState>> load_blob(LoadStateOptions opts = {});

  // Blocking forms, for threads that do not run the host's executor (a training loop). Each
  // waits at most the operation's own timeout plus a margin; called on the executor's thread
  // they refuse with errc::internal instead of deadlocking.
  result<StepResult> step_blocking(StepOptions opts);
  result<void> share_state_blocking(std::uint64_t epoch, Bytes metadata, Duration ttl = 300s);
  result<StateInfo> load_state_blocking(LoadStateOptions opts = {});

  // Bytes of state parts this averager served to newcomers (executor thread).
  std::uint64_t state_bytes_served() const noexcept;

  const Schema& schema() const noexcept { return schema_; }
  const Bytes& schema_hash() const noexcept { return schema_hash_; }
  const GroupKey& group_key() const noexcept { return key_; }
  MemberInfo self_info(double weight) const;
  net::StreamHost& host() { return *host_; }
  // Accountability's ban list (null when it is off). Executor thread.
  std::shared_ptr<acct::BanList> bans() const;
  bool banned(const PeerKey& peer) const;
  // A wrong_average verdict against the peer awaits its answer: left out of matchmaking meanwhile.
  bool suspected(const PeerKey& peer) const;
  // Reads the run's accusations from the directory into the ban list (each step does first).
  awaitable<void> poll_accusations();

  struct Impl;  // private helpers (join/round streams)

 private:
  friend class PendingStep;
  awaitable<void> run_step(std::shared_ptr<PendingStep::State> st);
  awaitable<result<StepResult>> step_body(std::shared_ptr<PendingStep::State> st);
  awaitable<result<void>> supply(std::shared_ptr<PendingStep::State> st, double weight,
                                 StepData data);
  std::span<const float> step_input(const PendingStep::State& st) const;
  // AveragerConfig::reuse_group: whether this step's matchmaking starts from the last group,
  // and that group as a view (entries open until `deadline`).
  bool reuse_last_group(const MatchmakingConfig& m) const;
  awaitable<result<void>> check_members(const GroupInfo& group, std::size_t me);
  awaitable<std::shared_ptr<detail::MatchSession>> await_match(const PeerKey& who);
  std::vector<MatchEntry> predicted_view(WallTime deadline) const;
  Averager(std::shared_ptr<net::StreamHost> host, std::shared_ptr<Directory> directory,
           Schema schema, std::vector<TensorView> tensors, AveragerConfig cfg, AddressSink sink);
  awaitable<void> serve_state(net::ByteStreamPtr s, net::PeerId remote);
  Bytes state_key() const;
  awaitable<result<void>> announce(std::uint64_t epoch, const Bytes& kind, Duration ttl);
  awaitable<result<std::vector<StateAnnouncement>>> announcements(const Bytes& kind);
  // size: the exact size expected (0: any size up to opts.max_bytes).
  awaitable<result<BlobState>> load_kind(Bytes kind, std::uint64_t size, LoadStateOptions opts);
  // Accountability (averager_acct.cpp).
  result<void> setup_accountability();
  std::shared_ptr<const detail::RoundAcctConfig> round_acct(const std::string& round) const;
  void on_evidence(const acct::Evidence& e);
  void publish_forged(const acct::Evidence& e);  // test-only Attack::directory_lie
  awaitable<result<void>> install_snapshot(std::uint64_t epoch, Bytes data, Bytes metadata,
                                           const Bytes& kind, std::size_t part_size);

  std::shared_ptr<net::StreamHost> host_;
  std::shared_ptr<Directory> directory_;
  Schema schema_;
  Bytes schema_hash_;
  std::vector<TensorView> tensors_;
  AveragerConfig cfg_;
  AddressSink add_addresses_;
  GroupKey key_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace starling::averaging
