// The io-thread half of starling::Optimizer: owns the ProgressTracker, runs the progress loop
// (publish own record, fetch others', expire stale ones), runs averaging rounds and state
// downloads for the training thread, and serves this peer's state to peers that fall behind.
// No torch here: tensors arrive as flat float buffers.
//
// Threading rule: the private state is touched only on the collaboration's executor, except the
// ProgressTracker, which both threads use through run() under `tracker_mu_`. The public methods
// marked "training thread" block the calling thread until the io thread has done the work
// (bounded); never call them from the io thread itself.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <asio/post.hpp>

#include "starling/optim/optimizer_options.hpp"
#include "starling/training/collaboration.hpp"
#include "starling/training/progress.hpp"

namespace starling::optim {

class OptimizerIo : public std::enable_shared_from_this<OptimizerIo> {
 public:
  static std::shared_ptr<OptimizerIo> start(std::shared_ptr<training::Collaboration> collab,
                                            training::ProgressTracker tracker,
                                            const OptimizerOptions& options);
  OptimizerIo(std::shared_ptr<training::Collaboration> collab, training::ProgressTracker tracker,
              const OptimizerOptions& options);

  // Any thread: runs f(tracker) under the tracker's lock, on the calling thread (a hop to the
  // io thread per step() would wait ~10 ms for it to be scheduled when threads outnumber
  // cores). The lock is held only for f: never across a co_await, never while waiting.
  template <class F>
  auto run(F&& f) -> std::invoke_result_t<F&, training::ProgressTracker&> {
    std::lock_guard lk(tracker_mu_);
    return f(tracker_);
  }

  // Training thread: one averaging round over `buf` (averaged in place). `while_waiting`, if
  // set, runs on the calling thread every kServePoll while the round is in flight (the
  // optimizer serves its state to peers that fall behind meanwhile).
  result<training::RoundResult> average(training::RoundData data, training::RoundOptions options,
                                        Duration wait_bound,
                                        std::function<void()> while_waiting = {});
  // Training thread: downloads state from a peer (one holding `want_digest` if not 0).
  result<training::Collaboration::State> download_state(Duration timeout, Duration wait_bound,
                                                        std::uint64_t want_digest);
  // Any thread: the gradient check failed for `peer` (Collaboration::convict).
  void convict(const net::PeerId& peer, std::string reason) {
    collab_->convict(peer, std::move(reason));
  }
  // Training thread: the collaboration may begin matchmaking for the coming round now.
  void prepare_round(training::RoundPlan plan);
  // Training thread: another member of the round prepared for `key` sent its data already.
  bool peers_supplied(const std::string& key) const { return collab_->peers_supplied(key); }
  // Training thread: the local epoch changed; the served state is outdated, the record is
  // published at once and a round prepared for the old epoch is dropped.
  void state_changed(std::uint64_t epoch);
  // Training thread: a peer wants this peer's state; offer_state() answers.
  bool state_requested() const noexcept { return state_requested_.load(); }
  void offer_state(std::uint64_t epoch, std::uint64_t digest, Bytes state);
  // Training thread: stops serving and the progress loop (bounded by `timeout`).
  result<void> stop(Duration timeout);

 private:
  awaitable<void> progress_loop();
  awaitable<void> publish_once(bool leaving = false);
  awaitable<void> fetch_once();
  awaitable<result<training::Collaboration::State>> provide_state();
  static awaitable<result<training::Collaboration::State>> provide_state_of(
      std::weak_ptr<OptimizerIo> weak);
  template <class T>
  // Runs make() on the io thread and waits at most `bound` for its result. `scoped`: inside
  // scope_, so that stop() cancels it (rounds and downloads; stop() itself is not).
  result<T> wait_for_io(std::function<awaitable<result<T>>()> make, Duration bound,
                        const char* what, bool scoped,
                        const std::function<void()>& while_waiting = {});
  static constexpr Duration kServePoll = 20ms;

  std::shared_ptr<training::Collaboration> collab_;
  asio::any_io_executor executor_;
  std::mutex tracker_mu_;
  training::ProgressTracker tracker_;  // guarded by tracker_mu_: use run()
  OptimizerOptions options_;
  TaskScope scope_;
  AsyncEvent wake_;
  AsyncEvent snapshot_ready_;
  std::optional<training::Collaboration::State> snapshot_;
  std::atomic<bool> state_requested_{false};
  TimePoint next_fetch_{};
  // The round average() runs now (io thread): abandoned when a fetch begun after it started
  // shows it cannot reach its majority (maybe_abandon_round()).
  struct Running {
    std::string key;
    std::uint64_t epoch = 0;
    std::size_t expected = 0;  // the count its majority guard came from
    TimePoint started;
    TimePoint counted_at;  // when that count was taken (the prepared round's plan, if used)
  };
  std::optional<Running> running_;
  // The round last prepared (matchmaking begun ahead): its count and when it was taken. A
  // round that completes it keeps that majority guard (NetCollaboration fixed it then).
  struct Prepared {
    std::string key;
    std::size_t expected = 0;
    TimePoint at;
  };
  std::optional<Prepared> prepared_;
  void maybe_abandon_round(TimePoint fetch_began, TimePoint now);  // tracker_mu_ held
  training::ProgressLimits limits_;
};

}  // namespace starling::optim
