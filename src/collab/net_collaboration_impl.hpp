// NetCollaboration's private state, shared by net_collaboration.cpp (progress, state transfer,
// lifetime) and net_collaboration_rounds.cpp (averaging rounds, early matchmaking).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "progress_guard.hpp"
#include "starling/averaging/dht_directory.hpp"
#include "starling/collab/net_collaboration.hpp"
#include "starling/crypto/keys.hpp"

namespace starling::collab {

using training::Layout;

// Testing robustness (NetCollaborationConfig::attack, net_collaboration_attack.cpp): the
// gradient a gradient attacker sends instead of `in` (into impl.attack_buf) and the weight it
// claims; false for attacks that do not corrupt the gradient.
bool corrupt_gradient(NetCollaborationConfig::Attack attack, std::span<const float> in,
                      const std::string& round, NetCollaboration::Impl& impl, double& weight);
// Attack::flood: fake progress records, each signed by one of kFloodIdentities fresh keys,
// copying `own` with 1000x its samples and rate (at most the decoder's limits).
constexpr std::size_t kFloodIdentities = 24;
std::vector<dht::Record> flood_records(NetCollaboration::Impl& impl, BytesView own,
                                       dht::Millis ttl);

struct NetCollaboration::Impl {
  explicit Impl(asio::any_io_executor ex) : scope(ex) {}
  std::shared_ptr<averaging::DhtDirectory> directory;
  std::shared_ptr<averaging::Averager> grads, state;
  std::shared_ptr<auth::MembershipService> members;  // a private run (else null)
  // Accountability (NetCollaborationConfig::verify): the run's bans, shared by the gradient
  // averagers; null when off.
  std::shared_ptr<averaging::acct::BanList> bans;
  std::vector<float> attack_buf;  // NetCollaborationConfig::attack: the corrupted gradient sent
  std::vector<float> alie_mean, alie_sq;    // alie: running moments of this peer's gradients
  std::vector<float> stale_prev;            // stale: the gradient of this peer's previous round
  std::vector<crypto::KeyPair> flood_keys;  // flood: the fake identities it publishes under
  dht::VersionClock flood_clock;
  ProgressGuard guard;  // the progress view's sanity (progress_guard.hpp)
  // The gradient averager's layout (names, sizes) and codec. It has no tensors of its own:
  // every round reads and writes the caller's buffers (training::RoundData).
  Layout layout;
  training::Compression compression = training::Compression::none;
  std::shared_ptr<std::function<awaitable<result<State>>()>> provider;
  std::shared_ptr<std::atomic<std::uint64_t>> served_epoch =
      std::make_shared<std::atomic<std::uint64_t>>(0);
  std::atomic<std::uint64_t> sent{0}, received{0};
  TaskScope scope;
  bool announcing = false, stopped = false;
  dht::RecordKey progress_key;

  // Early matchmaking: the round begun by prepare_round() (waiting for average()), and the
  // last one cancelled while it may still be matchmaking (the averager runs one step at a
  // time, so the next step waits for it to end).
  struct Prepared {
    std::string key;
    std::size_t min_group_size = 0;
    std::size_t expected_group = 0;  // StepOptions::expected_group_size (0: none)
    std::shared_ptr<averaging::Averager> averager;
    std::shared_ptr<averaging::PendingStep> step;
  };
  std::optional<Prepared> prepared;
  // The prepared round's key once another member's data reached it (peers_supplied(); read
  // from the training thread).
  mutable std::mutex supplied_mu;
  std::string supplied_key;
  std::shared_ptr<averaging::PendingStep> cancelled;
  // The step average() runs now (its key), and the key abandon_round() ended.
  std::shared_ptr<averaging::PendingStep> running;
  std::string running_key, abandoned_key;
  EarlyStats early;
};

}  // namespace starling::collab
