// The DeDLOC progress core: what a peer publishes about its training progress, and, from all
// peers' records, the collaboration's estimated progress and the decisions that follow from
// it (keep accumulating, begin matchmaking, average and step, step alone, download state).
//
// It does no I/O and never reads a clock: every call takes `now` (a steady-clock time point of
// the caller's own clock). Records carry relative ages, never wall times, so peers' clocks
// may disagree arbitrarily. No torch here.
//
// Threading rule: a ProgressTracker is a plain object used from one thread (the node's
// io_context thread in the networked optimizer).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "starling/core/bytes.hpp"
#include "starling/core/clock.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::training {

// One peer's progress record (the decoded pb::training::Progress).
struct PeerProgress {
  std::uint64_t epoch = 0;
  std::uint64_t samples_accumulated = 0;  // toward `epoch`'s target
  double samples_per_second = 0;
  std::uint64_t seq = 0;            // publication counter of this run of the peer
  Duration age_at_publish{0};       // measurement -> publication
  Duration ttl{0};                  // DHT ttl the record was stored with
  std::uint64_t samples_total = 0;  // contributed over the run
  bool client_mode = false;
  bool auxiliary = false;
  Duration publish_interval{0};  // the publisher republishes at least this often (0: unknown)
  std::uint64_t digest = 0;      // StateDigest of the publisher's parameters at epoch (0: unknown)
  bool leaving = false;          // its last record: the publisher left the collaboration

  friend bool operator==(const PeerProgress&, const PeerProgress&) = default;
};

// Bounds a decoded record must respect; anything outside is rejected (bad input).
struct ProgressLimits {
  std::size_t max_record_bytes = 256;
  double max_samples_per_second = 1e9;
  std::uint64_t max_samples = std::uint64_t{1} << 50;
  Duration max_age = std::chrono::hours(24);
};

// A fast 64-bit digest of a training state's bytes (not cryptographic: it detects accidental
// forks between honest peers, not forgeries). Peers holding bit-identical parameters compute
// the same value; the value is never 0 (0 means "unknown" in records).
class StateDigest {
 public:
  void update(const void* data, std::size_t n);
  std::uint64_t value() const;

 private:
  std::uint64_t h_ = 0x243F6A8885A308D3ULL;
  std::uint64_t len_ = 0;
};

Bytes encode_progress(const PeerProgress& p);
// Parses and validates a record from a peer: errc::too_large if over max_record_bytes,
// errc::invalid_argument if it is not a valid Progress message or a field is out of bounds
// (non-finite or negative samples/s, absurd counts or ages). Never throws.
result<PeerProgress> decode_progress(BytesView in, const ProgressLimits& limits = {});

// The age of a record fetched from the DHT, on the reader's clock: the age it had when
// published plus the time it has been stored (its ttl minus the remaining ttl the DHT
// reports; 0 if the DHT reports more than the record's ttl).
Duration record_age(const PeerProgress& p, Duration remaining_ttl);

struct ProgressConfig {
  // Samples the collaboration accumulates per optimizer step (the global batch). Independent
  // of the number of peers, so hyperparameters are too.
  std::uint64_t target_batch_size = 4096;
  // If > 0, the target is this many samples per computing peer at the epoch instead
  // (DiLoCo: H local steps x batch size), so a round comes after H local steps on average.
  std::uint64_t per_peer_target = 0;
  // Matchmaking for the next averaging round starts this long before the estimated time the
  // target is reached.
  Duration matchmaking_time = 5s;
  // A record older than this (on the reader's clock) is ignored: its peer is presumed gone.
  Duration stale_after = 30s;
  // Others' progress is fetched again after clamp(eta * refresh_fraction, min, max).
  Duration min_refresh = 150ms;
  Duration max_refresh = 10s;
  double refresh_fraction = 0.3;
  // The own record is republished at least this often (must be well below stale_after) and
  // at once when the epoch changes.
  Duration max_publish_interval = 5s;
  // A record also stops counting once older than its ttl, or than twice its publisher's
  // publish interval plus this grace (a publication may take a few seconds): a dead peer
  // stops counting after ~15 s with the defaults, not stale_after.
  Duration publish_grace = 5s;
  // Half-life of the local throughput estimate, in seconds of compute.
  double throughput_half_life_s = 10;
  // A peer whose epoch is more than this behind the collaboration's downloads state
  // (0 for synchronous steps, 1 with delayed parameter updates).
  std::uint64_t epoch_tolerance = 0;
  // Delayed parameter updates: peers one epoch behind the collaboration still count toward
  // its samples/s (their records stay at the round's epoch while the round runs).
  bool delayed_updates = false;
  // Networked peers: step alone only once a fetch of the others' records that began after the
  // last epoch change (and at least `startup_grace` after start()) has found nobody, so peers
  // started at the same moment, or whose records lag a fast round, do not step alone and fork.
  // Nor average before a fetch that began `startup_grace` after start() has completed: peers
  // started in the same instant see only the records published before their first fetch, and
  // a majority of such a partial view let two disjoint groups both average one epoch.
  bool confirm_alone = false;
  Duration startup_grace{0};
  // If > 0, the wait before the first round adapts to the network: once this peer's first
  // record is published (publish_took()), the view settles from start() +
  // clamp(grace_per_publish x that publication's duration, startup_grace_min, startup_grace)
  // instead of start() + startup_grace. A peer started with this one publishes in about the
  // same time, so its record is stored well before that fetch. A peer first seen at the
  // starting epoch before any step (it started later) moves that point to the time its
  // record was written plus the adapted wait (at most start() + startup_grace). Stepping alone
  // still waits for the whole startup_grace. 0: the fixed startup_grace.
  Duration startup_grace_min{0};
  double grace_per_publish = 10;
  // This peer computes no gradients (it only helps averaging).
  bool auxiliary = false;
  bool client_mode = false;
};

// The collaboration as one peer estimates it at `now`.
struct CollaborationView {
  std::uint64_t global_epoch = 0;  // highest epoch among live peers (and this one)
  // Estimated samples accumulated toward global_epoch's target by the live peers at that
  // epoch, extrapolated from each record's age with its samples/s.
  std::uint64_t samples_accumulated = 0;
  double samples_per_second = 0;  // all live computing peers
  std::size_t num_peers = 0;      // live peers, this one included
  std::size_t num_clients = 0;
  std::size_t num_auxiliary = 0;
  std::size_t peers_at_global_epoch = 0;      // live peers at global_epoch, this one included
  std::size_t computing_at_global_epoch = 0;  // of which not auxiliary
  // Live peers at global_epoch or one behind it, this one included: the base of a round's
  // majority (RoundOptions::expected_members). One behind may have stepped in a group this
  // view has not seen yet, or be about to download and join; two or more behind cannot join
  // this epoch's round before a download and do not count.
  std::size_t majority_base = 0;
  // When every live peer, this one and auxiliary ones included, is at global_epoch or at
  // least two epochs behind it (none one behind, which may still be finishing the previous
  // epoch's round; two behind must download the state before any round): the number at
  // global_epoch, the peers expected in this epoch's round; 0 otherwise.
  std::size_t all_at_epoch = 0;
  // This peer's view is complete enough for a round (ProgressTracker::view_settled); until
  // then it only accumulates.
  bool settled = true;
  std::uint64_t target = 0;     // samples that complete global_epoch
  std::optional<Duration> eta;  // until the target; nullopt if nobody computes
};

enum class Action {
  accumulate,         // keep computing gradients
  begin_matchmaking,  // look for an averaging group now (once per epoch)
  average_and_step,   // the target is reached: average with the group and step together
  step_alone,         // the target is reached and no other live peer is at this epoch
  download_state,     // this peer is behind: load parameters and optimizer state from peers
};
const char* to_string(Action a);

struct Decision {
  Action action = Action::accumulate;
  CollaborationView view;
  Duration next_fetch{0};  // when to fetch others' records again
  // download_state at this peer's own epoch: its parameters forked from those most peers at the
  // epoch hold; download the state with this digest.
  std::uint64_t want_digest = 0;
};

class ProgressTracker {
 public:
  ProgressTracker(net::PeerId self, ProgressConfig config);

  const ProgressConfig& config() const noexcept { return config_; }
  const net::PeerId& self() const noexcept { return self_; }
  std::uint64_t local_epoch() const noexcept { return epoch_; }
  std::uint64_t local_samples() const noexcept { return samples_; }
  std::uint64_t samples_total() const noexcept { return samples_total_; }
  double local_samples_per_second() const noexcept;

  // This peer processed `samples` more samples toward the current epoch, which took
  // `compute_time` of its time (time spent waiting for the network excluded).
  void report_samples(std::uint64_t samples, Duration compute_time);
  // The local epoch changed (a step was taken, or state was downloaded at `epoch`): the
  // accumulated samples restart at 0 and matchmaking may begin again.
  void set_epoch(std::uint64_t epoch);
  // The digest of this peer's parameters at its current epoch (published in its record).
  void set_digest(std::uint64_t digest) noexcept { digest_ = digest; }
  std::uint64_t digest() const noexcept { return digest_; }
  // Networked start at `now`: with confirm_alone, no step alone before now + startup_grace,
  // and no round before a fetch begun then has completed.
  void start(TimePoint now);
  // This peer loaded the state of peers ahead of it (not a digest vote's download): it
  // joined a running collaboration, whose peers it has seen, so its first round need not wait
  // for the startup grace (peers that join in the same instant still see partial views).
  void state_downloaded() { settle_from_.reset(); }
  // This peer's first record was published in `took` (see ProgressConfig::startup_grace_min):
  // the view may settle sooner. Later calls change nothing.
  void publish_took(Duration took);
  // A round of this peer failed at `now`: the view may be disturbed (a peer whose publishing
  // stalled on a dead node looks gone for a while), so with confirm_alone no step alone
  // before a live peer's record would have shown again (the shorter of stale_after and
  // 2 x max_publish_interval + publish_grace), and only after a fetch begun then found nobody.
  void round_failed(TimePoint now);
  // A fetch of the others' records that began at `began` (with epoch_generation() then `gen`)
  // completed: see ProgressConfig::confirm_alone.
  void fetched(TimePoint began, std::uint64_t gen);
  std::uint64_t epoch_generation() const noexcept { return generation_; }
  // A round this peer took part in succeeded and it moved to its new epoch (set_epoch and
  // set_digest done): the other members are at that epoch with the same parameters too, even
  // if their records (fetched before the round ended) still show the previous epoch.
  void round_succeeded(const std::vector<net::PeerId>& members, TimePoint now);
  // Delayed parameter updates: the round for the current epoch runs in the background. Until
  // end_background_round(), the published record keeps the epoch and the samples it averaged
  // (so peers still reaching the target join the same round), samples reported meanwhile count
  // toward the next epoch, and decide() only says accumulate.
  void begin_background_round();
  // The background round finished: `stepped` moves to the next epoch with the samples reported
  // meanwhile; otherwise they are added to this epoch's (the round is retried).
  void end_background_round(bool stepped);
  bool background_round() const noexcept { return background_; }
  // Restores counters from a checkpoint.
  void restore(std::uint64_t epoch, std::uint64_t samples_accumulated, std::uint64_t samples_total);

  // A record fetched at `now`, `age` old on this peer's clock (see record_age()). Records of
  // this peer itself are ignored; an older record of a peer than the one held is ignored. A
  // leaving record removes the peer at once (it no longer counts anywhere), and records of it
  // written before that one are ignored until stale_after.
  void observe(const net::PeerId& peer, const PeerProgress& record, Duration age, TimePoint now);
  // Whether a live computing peer other than this one is at this peer's epoch or ahead (if
  // not, this peer is really alone at its epoch and may step on its own).
  bool others_at_epoch(TimePoint now) const;
  // Whether this peer may step with its own data: no other live computing peer at its epoch or
  // ahead, and (with confirm_alone) a fresh fetch confirmed it (see alone_confirmed()).
  bool may_step_alone(TimePoint now) const { return !others_at_epoch(now) && alone_confirmed(now); }
  // Live computing peers at exactly `epoch`, this peer included if it is there.
  std::size_t peers_at(std::uint64_t epoch, TimePoint now) const;
  // Live computing peers past `epoch` (positive evidence that they moved on: records only
  // ever move forward).
  std::size_t peers_ahead(std::uint64_t epoch, TimePoint now) const;
  // Drops every record that no longer counts at `now` (see live()).
  void expire(TimePoint now);
  std::size_t known_peers() const noexcept { return peers_.size(); }
  // When (fetch time) a peer's leaving record was last taken (epoch of the clock if never).
  TimePoint last_departure() const noexcept { return last_departure_; }

  CollaborationView view(TimePoint now) const;
  // The next thing to do. Returns begin_matchmaking at most once per epoch (after that,
  // accumulate until the target is reached).
  Decision decide(TimePoint now);

  // How long to wait before fetching others' records again (what decide() puts in
  // next_fetch), without deciding anything.
  Duration next_fetch(TimePoint now) const;

  // The record to publish now (increments seq); remembers when it was published.
  PeerProgress make_record(TimePoint now, Duration ttl);
  // Whether the own record should be published at `now` (epoch changed since the last
  // publication, or the publish interval passed).
  bool should_publish(TimePoint now) const;

 private:
  struct Held {
    PeerProgress record;
    TimePoint observed_at;  // now - age when fetched
  };
  // How long a record counts after its publication: stale_after, its ttl, or twice its
  // publisher's interval plus publish_grace, whichever is shortest.
  Duration lifetime(const PeerProgress& r) const;
  // The same for a record with that ttl and publish interval (zero: unknown).
  Duration lifetime(Duration ttl, Duration publish_interval) const;
  // Live computing peers whose epoch satisfies `at` (this one included if its epoch does).
  template <class EpochPredicate>
  std::size_t count_computing(EpochPredicate at, TimePoint now) const;
  bool live(const Held& h, TimePoint now) const;
  Duration fetch_interval(const CollaborationView& v, TimePoint now) const;
  // A peer's samples at `now`, extrapolated from its record (at most stale_after ahead).
  std::uint64_t extrapolate(const Held& h, TimePoint now) const;
  // The digest most live computing peers at this peer's epoch hold (ties: the larger value),
  // this peer included; nullopt unless at least one other peer there publishes a digest.
  std::optional<std::uint64_t> winning_digest(TimePoint now) const;
  // Whether stepping alone is allowed now (see ProgressConfig::confirm_alone).
  bool alone_confirmed(TimePoint now) const;
  // Whether this peer's view of the others is complete enough for a round's majority: a fetch
  // that began startup_grace after start() has completed, or the peer downloaded the state of
  // a running collaboration (see ProgressConfig::confirm_alone).
  bool view_settled(TimePoint now) const;

  net::PeerId self_;
  ProgressConfig config_;
  std::map<net::PeerId, Held> peers_;
  // Peers that said they left: when their leaving record was written (our clock).
  std::map<net::PeerId, TimePoint> departed_;
  TimePoint last_departure_{};
  std::uint64_t epoch_ = 0;
  std::uint64_t samples_ = 0;
  std::uint64_t samples_total_ = 0;
  // Decayed sums for the throughput estimate (samples and seconds of compute).
  double ema_samples_ = 0;
  double ema_seconds_ = 0;
  std::uint64_t seq_ = 0;
  std::optional<TimePoint> last_publish_;
  std::uint64_t published_epoch_ = 0;
  std::optional<std::uint64_t> matchmaking_epoch_;  // epoch matchmaking was begun for
  bool background_ = false;                         // a background round runs for epoch_
  std::uint64_t next_samples_ = 0;                  // samples toward epoch_ + 1 while it runs
  std::uint64_t digest_ = 0;
  std::uint64_t published_digest_ = 0;
  std::uint64_t generation_ = 0;  // incremented by every epoch change
  std::optional<TimePoint> hold_alone_until_;
  std::optional<TimePoint> settle_from_;   // start() + startup_grace
  std::optional<TimePoint> started_;       // start()
  std::optional<Duration> adapted_grace_;  // set by publish_took()
  std::uint64_t started_epoch_ = 0;
  std::optional<std::pair<TimePoint, std::uint64_t>> confirming_fetch_;  // began, generation
};

}  // namespace starling::training
