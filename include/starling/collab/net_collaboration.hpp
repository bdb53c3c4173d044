// NetCollaboration: the networked training::Collaboration (collaboration.hpp) on one libp2p Host,
// a Kademlia DhtNode and two Averagers (gradients and state). No torch.
//
// - Progress records: a DHT dictionary under BLAKE2b("starling/collab/progress/" + run_id);
//   each peer writes one sub-key it owns ("progress" + its owner marker, signed by the DHT
//   layer, so nobody else can overwrite or forge it). fetch_progress() returns each owner's
//   value with the remaining TTL the DHT reports.
// - average(): Averager::step on the gradient averager ("<run_id>.grads"), with the round key
//   (e.g. "grads/12") as the step's round, so peers at different epochs never average
//   together; the averager reads the caller's input buffer and writes the result into its
//   output buffer directly (training::RoundData): nothing is copied on the io thread.
// - prepare_round() (early matchmaking): Averager::begin() on the gradient averager for the
//   plan's round key, so the group forms while the gradients are still being computed;
//   average() with that key hands the tensors to the pending step (PendingStep::run) instead
//   of starting a fresh step. average() with another key, cancel_prepared_round() and stop()
//   cancel it (PendingStep::cancel: its group goes on without this peer).
// - download_state()/serve_state(): blob state transfer on the state averager
//   ("<run_id>.state"): donors serve the provider's bytes lazily and re-announce themselves
//   every state_ttl / 3; a newcomer downloads from several donors in parallel. The state's
//   digest is the snapshot's metadata, so a peer repairing a fork picks donors by digest.
//
// Threading rule: every method runs on the host's executor (executor()); stop() is bounded.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "starling/auth/membership_service.hpp"
#include "starling/averaging/averager.hpp"
#include "starling/dht/node.hpp"
#include "starling/net/host.hpp"
#include "starling/training/collaboration.hpp"

namespace starling::collab {

struct NetCollaborationConfig {
  std::string run_id;              // 1..48 printable characters without '/', '[' or ']'
  std::vector<std::string> addrs;  // addresses group members dial (empty: the host's)
  bool client_mode = false;
  // Asked before each round and state announcement (AveragerConfig::client_now): true = take
  // part as a client member (send, receive, own no part). TrainingNode sets it from AutoNAT:
  // a peer that is not publicly reachable owns no part, so no all-reduce stream has to reach
  // it through a relay (whose circuit limits would reset it).
  std::function<bool()> client_now;
  std::uint64_t bandwidth = 12'500'000;  // declared bytes/s (splits all-reduce shares)
  // Rounds pace their uploads at upload_pace x bandwidth (AveragerConfig::upload_pace); 0 (the
  // default) does not pace: `bandwidth` is then only a share weight, not a cap, so a trainer
  // that never declared its uplink is not slowed to the default's 100 Mbit/s. `starling
  // train --max-bandwidth` declares it and turns pacing on.
  double upload_pace = 0;
  averaging::MatchmakingConfig matchmaking = default_matchmaking();
  Duration stall_timeout = 10s;  // a group member silent this long is dropped from the round
  Duration open_timeout = 10s;   // opening a stream to a group member
  Duration state_ttl = 60s;      // state announcements (renewed every state_ttl / 3)
  std::uint64_t max_state_bytes = std::uint64_t{1} << 30;
  std::size_t reduce_threads = 1;
  bool error_feedback = true;  // for lossy gradient compression
  // How this peer reduces the gradient parts it owns (mean, or CenteredClip against hostile
  // peers; averaging/robust.hpp). Every peer of a run should use the same.
  averaging::AggregationConfig aggregation;
  // Testing robustness only: this peer sends a corrupted gradient (and claims 10x its
  // samples) in every round; it still applies the group's result. sign_flip: -10 x its
  // gradient; random: Gaussian noise 100x the gradient's RMS. (A merely scaled gradient is no
  // attack on Adam-like optimizers, which normalise the step's scale.)
  // wrong_average and different_parts cheat in the accountable round (needs `verify`): an
  // owner that shifts its results, a member that sends one owner other values than it
  // committed (averaging::AccountabilityConfig::Attack).
  // false_report: lies in its projection reports to get honest owners banned. directory_lie:
  // reports honestly, but publishes false wrong_average accusations of the other owners' parts
  // in the directory (a minority's, which readers do not act on). flood: besides its own
  // progress record, publishes fake ones under 24 fresh identities claiming 1000x its samples
  // and rate (ProgressGuard keeps the view sane).
  // alie ("a little is enough", Baruch et al. 2019): sends its gradient minus one standard
  // deviation in every coordinate (estimated from its own recent gradients), at its true
  // weight: a shift small enough to pass as an honest peer's noise, in one direction every
  // round. stall: joins groups, then sends nothing (AveragerConfig::test_stall).
  // stale: sends the gradient of its previous round (a lazy peer reusing old work; its first
  // round is honest); inflated: declares 4x the samples it computed (the gradient is its own).
  // Both pass every check but the gradient check.
  enum class Attack : std::uint8_t {
    none,
    sign_flip,
    random,
    wrong_average,
    different_parts,
    false_report,
    alie,
    stall,
    directory_lie,
    flood,
    stale,
    inflated
  };
  Attack attack = Attack::none;
  // A private run (docs/security.md, "Private runs"): only peers holding a certificate signed
  // by the run key are matched with, grouped with, served state or downloaded from, and only
  // their progress records count (auth::MembershipService). None: an open run.
  std::optional<auth::MembershipConfig> membership;
  // Accountability (docs/security.md): gradient rounds sign and check every statement,
  // evidence bans the cheater for the run, banned peers are left out of matchmaking and their
  // progress records are ignored. Gradients then travel uncompressed. Every peer of a run
  // must use the same.
  bool verify = false;
  // Gradient check (needs `verify`; docs/security.md "Gradient check"): after each checked
  // round, this many members drawn from the round's seed are every member's targets; the
  // round's result carries their values on the parts this peer owns (RoundResult::
  // grad_samples) and convict() bans a target whose re-computation differs. 0: off.
  std::uint32_t grad_check_targets = 0;

  static averaging::MatchmakingConfig default_matchmaking();
};

// Early matchmaking counters (executor thread).
struct EarlyStats {
  std::uint64_t prepared = 0;   // rounds begun by prepare_round()
  std::uint64_t used = 0;       // average() calls that completed a prepared round
  std::uint64_t cancelled = 0;  // prepared rounds dropped (stale key, cancel, stop)
};

class NetCollaboration final : public training::Collaboration,
                               public std::enable_shared_from_this<NetCollaboration> {
 public:
  // The host must be started and the DHT node started (bootstrapped or alone).
  static result<std::shared_ptr<NetCollaboration>> create(std::shared_ptr<net::Host> host,
                                                          std::shared_ptr<dht::DhtNode> node,
                                                          NetCollaborationConfig cfg);
  ~NetCollaboration() override;

  // Stops serving state and the averagers; bounded (a few seconds). Call on executor().
  awaitable<void> stop();

  // Accountability: the peers banned for this run so far and why ("part_mismatch", "false
  // accusation", ...); empty when verify is off. Call on executor().
  struct BannedPeer {
    net::PeerId peer;
    std::string reason;
  };
  std::vector<BannedPeer> banned_peers() const;

  asio::any_io_executor executor() override;
  const net::PeerId& self() const override;
  awaitable<result<void>> publish_progress(Bytes value, Duration ttl) override;
  awaitable<result<std::vector<training::ProgressEntry>>> fetch_progress() override;
  void prepare_round(const training::RoundPlan& plan) override;
  bool peers_supplied(const std::string& key) const override;
  void cancel_prepared_round() override;
  void abandon_round(const std::string& key) override;
  awaitable<result<training::RoundResult>> average(training::RoundData data,
                                                   training::RoundOptions options) override;
  awaitable<result<State>> download_state(TimePoint deadline, std::uint64_t want_digest) override;
  void serve_state(std::function<awaitable<result<State>>()> provider) override;
  void convict(const net::PeerId& peer, std::string reason) override;
  std::uint64_t bytes_sent() const override;
  std::uint64_t bytes_received() const override;

  // Counters (executor thread): completed rounds, state downloads.
  std::uint64_t rounds() const noexcept { return rounds_; }
  std::uint64_t state_downloads() const noexcept { return downloads_; }
  const EarlyStats& early_stats() const noexcept;
  // The key of the round prepared now ("" if none) and whether its group has formed.
  std::string prepared_round() const;
  bool prepared_round_grouped() const;
  // The private run's membership (null in an open run).
  std::shared_ptr<auth::MembershipService> membership() const;

  struct Impl;

 private:
  NetCollaboration(std::shared_ptr<net::Host> host, std::shared_ptr<dht::DhtNode> node,
                   NetCollaborationConfig cfg);
  result<void> ensure_grads(const std::vector<std::pair<std::string, std::size_t>>& layout,
                            training::Compression c);
  averaging::StepOptions step_options(const training::RoundOptions& o) const;
  // Accountability: `peer` is banned for the run (false when verify is off).
  bool banned(const net::PeerId& peer) const;
  // Waits (bounded by `until`) for a cancelled prepared step to end; false if it did not.
  awaitable<bool> wait_cancelled(TimePoint until);
  static awaitable<void> announce_loop(std::weak_ptr<NetCollaboration> weak);

  std::shared_ptr<net::Host> host_;
  std::shared_ptr<dht::DhtNode> node_;
  NetCollaborationConfig cfg_;
  std::unique_ptr<Impl> impl_;
  std::uint64_t rounds_ = 0, downloads_ = 0;
};

}  // namespace starling::collab
