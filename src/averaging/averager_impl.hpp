// Averager internals shared by averager.cpp and state_transfer.cpp.
//
// Threading rule: the host's executor only.
#pragma once

#include <map>
#include <memory>

#include "match_session.hpp"
#include "part_codec.hpp"
#include "round_runner.hpp"
#include "starling/averaging/averager.hpp"

namespace starling::averaging {

// A state snapshot this peer serves to newcomers (state_transfer.cpp).
struct StateSnapshot {
  StateManifest manifest;
  Bytes data;
};

// One step from begin() to its end (averager.cpp).
struct PendingStep::State {
  explicit State(asio::any_io_executor ex) : done(ex) {}
  std::shared_ptr<Averager> avg;
  StepOptions opts;
  TimePoint t0, deadline, data_deadline;
  bool data_ready = false, run_called = false, cancelled = false, grouped = false;
  double weight = 0;
  StepData data;  // the caller's buffers (empty: the averager's tensors and own buffers)
  std::shared_ptr<detail::MatchSession> match;  // while matchmaking
  std::shared_ptr<detail::RoundRunner> runner;  // while the round runs
  std::optional<result<StepResult>> outcome;    // set when the step is over
  std::function<void()> on_peer_data;           // PendingStep::on_peer_data()
  bool peer_data = false;
  AsyncEvent done;
};

struct Averager::Impl {
  explicit Impl(asio::any_io_executor ex) : round_registered(ex), match_started(ex), steps(ex) {}
  std::map<Bytes, std::shared_ptr<detail::RoundRunner>> rounds;  // by group id
  AsyncEvent round_registered;
  std::shared_ptr<detail::MatchSession> match;
  AsyncEvent match_started;  // pulsed when a matchmaking session begins
  // The members of the last successful matched round (empty after a failure): the view an
  // intact group predicts for its next round (AveragerConfig::reuse_group).
  std::vector<MemberInfo> last_members;
  std::weak_ptr<PendingStep::State> step;  // the step in flight (stop() ends it)
  TaskScope steps;  // runs every step's coroutine (stop() waits for it, bounded)
  // The snapshot served now and the one before it (downloads of it in progress finish).
  std::shared_ptr<const StateSnapshot> snapshot, previous;
  Averager::BlobSource blob_source;
  std::uint64_t state_bytes_served = 0;
  std::string join_protocol, allreduce_protocol, state_protocol;  // per-averager ids
  bool started = false, stopped = false, stepping = false;
  detail::TensorCodecs codecs;  // per-tensor codecs from the schema
  // Error feedback (or empty): what earlier steps' encodings of this peer's values, and of the
  // results it reduced as an owner, lost.
  std::vector<float> residual, result_residual;
  // The flattened input and output of a step (reused so that steps do not page-fault).
  std::vector<float> local_buf, output_buf;
  // Accountability (null: off): the ban list and the identity key that signs.
  std::shared_ptr<acct::BanList> bans;
  std::optional<crypto::KeyPair> acct_key;
  bool polling = false;                     // poll_accusations() running
  std::vector<acct::Evidence> unpublished;  // pending verdicts found here (averager_acct.cpp)
};

}  // namespace starling::averaging
