// The seam between the collaborative optimizer and the network: what the optimizer needs from
// the DHT (progress records) and from the averager (averaging rounds over named float spans,
// state download). The real implementation sits on starling::dht and starling::averaging
// (phase 2); tests use an in-process double. No torch here.
//
// Threading rule: every method is called from, and its coroutines run on, executor() (the
// node's io_context thread). Implementations hold no locks.
//
// Implementations: collab::NetCollaboration (the DHT and the averager; early matchmaking on
// Averager::begin()), tests/optim/fake_collaboration.hpp (an in-process double).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "starling/core/async.hpp"
#include "starling/core/bytes.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::training {

// A progress record as the DHT returns it: the publisher (the signed sub-key), the value, and
// the remaining time-to-live the DHT reported (for the record's age, see record_age()).
struct ProgressEntry {
  net::PeerId peer;
  Bytes value;
  Duration remaining_ttl{0};
};

// Tensor compression on the wire.
enum class Compression {
  none,     // float32
  float16,  // half precision (2x smaller)
  uint8,    // 8-bit blockwise quantisation (4x smaller)
};
const char* to_string(Compression c);
result<Compression> parse_compression(const std::string& s);

// The tensors of a round by name and size (elements), in order; names and sizes must match
// across peers.
using Layout = std::vector<std::pair<std::string, std::size_t>>;

// A round's data: this peer's values and where the group's average goes, each one flat buffer
// in `layout` order. The implementation reads `input` and writes `output` in place (no copies
// of its own), so both must stay alive until the round is over: `owner` holds them, also when
// the caller stopped waiting. `output` is meaningful only if the round succeeded.
struct RoundData {
  Layout layout;
  std::span<const float> input;
  std::span<float> output;
  std::shared_ptr<const void> owner;
};
// The layout's total size, if input and output both have it (else errc::invalid_argument).
result<std::size_t> check_round_data(const RoundData& d);

struct RoundOptions {
  // Peers that use the same key average together ("grads/<epoch>", "state/<epoch>").
  std::string key;
  // This peer's weight (its samples for gradients; 0 for auxiliary peers and peers that only
  // follow along).
  double weight = 0;
  // The round (matchmaking + all-reduce) fails with errc::timeout after this.
  TimePoint deadline;
  Compression compression = Compression::none;
  // Peers the caller believes are at this round's epoch or one behind it, itself included
  // (0: unknown; CollaborationView::majority_base). A
  // networked implementation requires a strict majority of them in the group, so that two
  // disjoint groups can never both succeed for one key (their parameters would fork).
  std::size_t expected_members = 0;
  // Every peer expected to join this round, itself included, when the caller's progress view
  // shows every live peer (auxiliary ones too) at this round's epoch or two or more behind; 0
  // otherwise. A networked implementation begins the round as soon as its group holds that
  // many, instead of waiting for latecomers (CollaborationView::all_at_epoch).
  std::size_t expected_group = 0;
  // Every live peer the caller knows of, itself included (CollaborationView::num_peers; 0:
  // unknown). When it equals expected_group nobody outside the expected peers can join, and a
  // networked implementation may match an intact group without the DHT; otherwise a peer
  // behind (catching up by a download) must be able to find the round there.
  std::size_t live_peers = 0;
};

// A round announced ahead of its data (Collaboration::prepare_round).
struct RoundPlan {
  // As average() will get them; weight is an estimate (the real one comes with average()),
  // deadline is the end of the whole round.
  RoundOptions options;
  // When average() is expected (the collaboration's estimate of reaching the target).
  TimePoint expected_start;
  // Names and sizes (elements) of the tensors average() will get, in order.
  Layout layout;
};

struct RoundMember {
  net::PeerId peer;
  double weight = 0;
};

// Gradient check (docs/security.md "Gradient check"): a member drawn by the round's seed, the
// weight (samples) it declared, the group's median declared weight, and its values on the
// ranges of the flat vector this peer owned, for the optimizer to re-compute and compare.
struct ContributionSample {
  net::PeerId peer;
  double weight = 0;
  double median_weight = 0;
  struct Slice {
    std::uint64_t offset = 0;
    std::vector<float> values;
  };
  std::vector<Slice> slices;
};

struct RoundResult {
  std::vector<RoundMember> members;  // this peer included
  double total_weight = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  Duration matchmaking_time{0};
  Duration allreduce_time{0};
  bool early = false;  // the group formed ahead of the data (prepare_round)
  std::vector<ContributionSample> grad_samples;  // gradient check: the drawn members' values
};

class Collaboration {
 public:
  virtual ~Collaboration() = default;
  virtual asio::any_io_executor executor() = 0;
  virtual const net::PeerId& self() const = 0;

  // Publishes this peer's progress record (a signed dictionary entry under the run's
  // progress key, sub-key = own peer id) with the given time-to-live.
  virtual awaitable<result<void>> publish_progress(Bytes value, Duration ttl) = 0;
  // Every peer's current progress record.
  virtual awaitable<result<std::vector<ProgressEntry>>> fetch_progress() = 0;

  // Early matchmaking (optional). The optimizer announces a round before its data is ready:
  // implementations may begin forming the group for plan.options.key now. A later average()
  // with that key (and the plan's layout and compression) completes the prepared round with
  // its tensors; average() with another key, cancel_prepared_round() or shutdown drops it
  // (the group, if formed, goes on without this peer). At most one round is prepared at a
  // time; a new plan replaces an older one with another key.
  virtual void prepare_round(const RoundPlan& plan) {}
  // The prepared round will not run here (this peer's epoch moved on: it stepped, downloaded
  // the state, or leaves).
  virtual void cancel_prepared_round() {}
  // The round for `key` cannot succeed any more (a fresh progress fetch shows peers past this
  // peer's epoch and too few left at it for the majority it needs): a prepared round is
  // dropped, and an average() for it still matchmaking (no group formed yet) ends at once
  // with errc::unavailable instead of at its deadline. A round whose group formed goes on:
  // its members count on this one.
  virtual void abandon_round(const std::string& key) {}
  // Any thread: the group of the round prepared for `key` formed and another member sent it
  // its data (that member counted the target reached), so this peer's data would end the
  // group's wait now.
  virtual bool peers_supplied(const std::string& key) const { return false; }
  // Writes into data.output the weighted average (sum w_i x_i / sum w_i) of the inputs of the
  // group that formed for options.key. If the total weight is 0, the plain average.
  // Errors: timeout (no group before the deadline), unavailable (no other peer), cancelled,
  // invalid_argument (sizes that do not match the layout).
  virtual awaitable<result<RoundResult>> average(RoundData data, RoundOptions options) = 0;

  // Downloads the newest training state (save_training_state() bytes, the epoch they are at
  // and the StateDigest of their parameters) from a peer at the collaboration's epoch. With
  // `want_digest` != 0, prefers a donor whose state has that digest (the state most peers at
  // an epoch hold, after a fork); without one, the newest state held by the most donors.
  struct State {
    std::uint64_t epoch = 0;
    Bytes bytes;
    std::uint64_t digest = 0;  // 0: unknown
  };
  virtual awaitable<result<State>> download_state(TimePoint deadline,
                                                  std::uint64_t want_digest) = 0;
  // Makes this peer serve its state to peers that download it. The provider runs on
  // executor() and returns the current state.
  virtual void serve_state(std::function<awaitable<result<State>>()> provider) = 0;

  // The gradient check failed for `peer` here (its values differ from the re-computation):
  // implementations ban it locally for the run (never published: a third party could only
  // check it by re-computing). Called from any thread. Default: ignored.
  virtual void convict(const net::PeerId& peer, std::string reason) {}

  // Bytes this peer sent and received for training so far (for statistics).
  virtual std::uint64_t bytes_sent() const { return 0; }
  virtual std::uint64_t bytes_received() const { return 0; }
};

}  // namespace starling::training
