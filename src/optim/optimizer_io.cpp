// The io-thread half of starling::Optimizer.
#include "optimizer_io.hpp"

#include <future>

#include <asio/co_spawn.hpp>

#include <fmt/format.h>

#include "starling/core/log.hpp"

namespace starling::optim {
namespace {

auto log() {
  return logger("optim");
}

// Bounds on single DHT operations of the progress loop.
constexpr Duration kPublishTimeout = 10s;
// At shutdown: the last record's time-to-live, and how long its publication may take.
constexpr Duration kLeavingTtl = 1s;
constexpr Duration kLeavingPublishTimeout = 3s;
constexpr Duration kFetchTimeout = 10s;
// The progress loop checks whether to publish at least this often.
constexpr Duration kLoopTick = 250ms;
// A state request waits this long for the training thread to serialise its state.
constexpr Duration kSnapshotWait = 30s;

}  // namespace

awaitable<result<training::Collaboration::State>> OptimizerIo::provide_state_of(
    std::weak_ptr<OptimizerIo> weak) {
  auto self = weak.lock();
  if (!self) co_return make_error(errc::unavailable, "optimizer is gone");
  co_return co_await self->provide_state();
}

std::shared_ptr<OptimizerIo> OptimizerIo::start(std::shared_ptr<training::Collaboration> collab,
                                                training::ProgressTracker tracker,
                                                const OptimizerOptions& options) {
  auto io = std::make_shared<OptimizerIo>(std::move(collab), std::move(tracker), options);
  std::weak_ptr<OptimizerIo> weak = io;
  asio::post(io->executor_, [io, weak] {
    // Not a coroutine lambda: the coroutine is a named function whose parameter lives in its
    // frame, so it does not depend on the lifetime of this lambda.
    // An auxiliary peer's parameters are not the collaboration's: it serves no state.
    if (!io->options_.auxiliary)
      io->collab_->serve_state([weak] { return provide_state_of(weak); });
    io->scope_.spawn(io->progress_loop());
  });
  return io;
}

OptimizerIo::OptimizerIo(std::shared_ptr<training::Collaboration> collab,
                         training::ProgressTracker tracker, const OptimizerOptions& options)
    : collab_(std::move(collab)),
      executor_(collab_->executor()),
      tracker_(std::move(tracker)),
      options_(options),
      scope_(executor_),
      wake_(executor_),
      snapshot_ready_(executor_) {}

namespace {

// Runs one io-thread job inside the optimizer's scope (so stop() cancels it) and hands its
// result (or its exception) to the waiting thread.
template <class T>
struct ScopedJob {
  std::shared_ptr<std::promise<result<T>>> promise;
  std::function<awaitable<result<T>>()> make;
  awaitable<void> operator()() const {
    try {
      auto r = co_await make();
      promise->set_value(std::move(r));
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  }
};

}  // namespace

template <class T>
result<T> OptimizerIo::wait_for_io(std::function<awaitable<result<T>>()> make, Duration bound,
                                   const char* what, bool scoped,
                                   const std::function<void()>& while_waiting) {
  auto promise = std::make_shared<std::promise<result<T>>>();
  auto fut = promise->get_future();
  auto self = shared_from_this();
  if (scoped) {
    ScopedJob<T> job{promise, std::move(make)};
    asio::post(executor_, [self, job = std::move(job), what]() mutable {
      if (self->scope_.closed())
        job.promise->set_value(
            make_error(errc::closed, fmt::format("{}: optimizer stopped", what)));
      else
        self->scope_.spawn(std::move(job));
    });
  } else {
    asio::co_spawn(
        executor_,
        [self, promise, make = std::move(make)]() -> awaitable<void> {
          promise->set_value(co_await make());
        },
        [promise](std::exception_ptr e) {
          if (e) promise->set_exception(e);
        });
  }
  const TimePoint until = Clock::now() + bound;
  // Rounds and downloads (scoped) can be interrupted; stop() cannot.
  const bool interruptible = scoped && options_.interrupted;
  const bool poll = while_waiting || interruptible;
  for (;;) {
    const Duration left = until - Clock::now();
    const Duration slice = poll ? std::min<Duration>(left, kServePoll) : left;
    if (fut.wait_for(std::max<Duration>(slice, Duration::zero())) == std::future_status::ready)
      break;
    if (Clock::now() >= until)
      return make_error(errc::timeout, fmt::format("{}: the io thread did not answer", what));
    if (interruptible && options_.interrupted())
      return make_error(errc::cancelled, fmt::format("{}: interrupted", what));
    if (while_waiting) while_waiting();
  }
  try {
    return fut.get();
  } catch (const std::exception& e) {
    return make_error(errc::cancelled, fmt::format("{}: {}", what, e.what()));
  }
}

result<training::RoundResult> OptimizerIo::average(training::RoundData data,
                                                   training::RoundOptions options,
                                                   Duration wait_bound,
                                                   std::function<void()> while_waiting) {
  auto self = shared_from_this();
  return wait_for_io<training::RoundResult>(
      [self, data = std::move(data), options]() -> awaitable<result<training::RoundResult>> {
        const Duration budget = std::max<Duration>(options.deadline - Clock::now(), 1ms);
        std::string what = "averaging round " + options.key;
        const auto now = Clock::now();
        self->running_ = Running{
            options.key, self->run([](training::ProgressTracker& t) { return t.local_epoch(); }),
            options.expected_members, now, now};
        if (const auto& p = self->prepared_; p && p->key == options.key) {
          self->running_->expected = std::max(p->expected, options.expected_members);
          self->running_->counted_at = p->at;
        }
        auto op = self->collab_->average(data, options);
        auto r = co_await with_timeout(std::move(op), budget + 1s, std::move(what));
        if (self->running_ && self->running_->key == options.key) self->running_.reset();
        co_return r;
      },
      wait_bound, "averaging round", true, while_waiting);
}

result<training::Collaboration::State> OptimizerIo::download_state(Duration timeout,
                                                                   Duration wait_bound,
                                                                   std::uint64_t want_digest) {
  auto self = shared_from_this();
  return wait_for_io<training::Collaboration::State>(
      [self, timeout, want_digest]() -> awaitable<result<training::Collaboration::State>> {
        auto op = self->collab_->download_state(Clock::now() + timeout, want_digest);
        co_return co_await with_timeout(std::move(op), timeout + 1s, "state download");
      },
      wait_bound, "state download", true);
}

void OptimizerIo::prepare_round(training::RoundPlan plan) {
  auto self = shared_from_this();
  auto p = std::make_shared<training::RoundPlan>(std::move(plan));
  asio::post(executor_, [self, p] {
    if (self->scope_.closed()) return;
    self->prepared_ = Prepared{p->options.key, p->options.expected_members, Clock::now()};
    self->collab_->prepare_round(*p);
  });
}

void OptimizerIo::state_changed(std::uint64_t epoch) {
  auto self = shared_from_this();
  asio::post(executor_, [self, epoch] {
    // Posted after the prepare_round() of the old epoch (if any), so this drops exactly it.
    self->collab_->cancel_prepared_round();
    self->prepared_.reset();
    if (self->snapshot_ && self->snapshot_->epoch != epoch) self->snapshot_.reset();
    // Look at the others again soon: decisions at the new epoch need their new records.
    const auto refresh =
        self->run([](training::ProgressTracker& t) { return t.config().min_refresh; });
    self->next_fetch_ = std::min(self->next_fetch_, Clock::now() + refresh);
    self->wake_.set();
  });
}

void OptimizerIo::offer_state(std::uint64_t epoch, std::uint64_t digest, Bytes state) {
  auto self = shared_from_this();
  auto bytes = std::make_shared<Bytes>(std::move(state));
  asio::post(executor_, [self, epoch, digest, bytes] {
    self->snapshot_ = training::Collaboration::State{epoch, std::move(*bytes), digest};
    self->state_requested_ = false;
    self->snapshot_ready_.set();
  });
}

awaitable<result<training::Collaboration::State>> OptimizerIo::provide_state() {
  const auto epoch = run([](training::ProgressTracker& t) { return t.local_epoch(); });
  if (!snapshot_ || snapshot_->epoch != epoch) {
    // The training thread serialises its state at its next step() call.
    snapshot_.reset();
    snapshot_ready_.reset();
    state_requested_ = true;
    auto waited = co_await with_timeout(snapshot_ready_.wait(), kSnapshotWait,
                                        "waiting for the training thread to serialise state");
    if (!waited) co_return waited.error();
    if (!snapshot_) co_return make_error(errc::unavailable, "state changed while serialising");
  }
  co_return *snapshot_;
}

awaitable<void> OptimizerIo::publish_once(bool leaving) {
  const Duration ttl = leaving ? kLeavingTtl : options_.progress_ttl;
  auto rec = run([&](training::ProgressTracker& t) { return t.make_record(Clock::now(), ttl); });
  rec.leaving = leaving;
  const TimePoint began = Clock::now();
  auto r =
      co_await with_timeout(collab_->publish_progress(training::encode_progress(rec), ttl),
                            leaving ? kLeavingPublishTimeout : kPublishTimeout, "publish progress");
  if (!r) log()->info("publishing progress failed: {}", r.error().message());
  if (r && !leaving) {
    const Duration took = Clock::now() - began;
    run([&](training::ProgressTracker& t) {
      t.publish_took(took);
      return 0;
    });
  }
}

awaitable<void> OptimizerIo::fetch_once() {
  const TimePoint began = Clock::now();
  const std::uint64_t generation =
      run([](training::ProgressTracker& t) { return t.epoch_generation(); });
  auto r = co_await with_timeout(collab_->fetch_progress(), kFetchTimeout, "fetch progress");
  const TimePoint now = Clock::now();
  std::lock_guard lk(tracker_mu_);  // maybe_abandon_round reads the tracker too
  if (r) tracker_.fetched(began, generation);
  if (!r) {
    log()->info("fetching progress failed: {}", r.error().message());
  } else {
    for (const auto& e : r.value()) {
      if (e.peer == tracker_.self()) continue;
      auto rec = training::decode_progress(e.value, limits_);
      if (!rec) {
        log()->warn("ignoring progress record of {}: {}", e.peer.short_string(),
                    rec.error().message());
        continue;
      }
      tracker_.observe(e.peer, rec.value(), training::record_age(rec.value(), e.remaining_ttl),
                       now);
    }
  }
  tracker_.expire(now);
  if (r) maybe_abandon_round(began, now);
  next_fetch_ = now + tracker_.next_fetch(now);
}

void OptimizerIo::maybe_abandon_round(TimePoint fetch_began, TimePoint now) {
  if (!running_ || fetch_began < running_->started) return;
  // The round needs a strict majority of the peers expected at its epoch; peers that moved
  // past that epoch never join it. Only that positive evidence counts: a peer missing from
  // the view may merely have published late (its publishing stalled on a dead node), and
  // abandoning a round it is in would leave both to fail it (and the round's own deadlines
  // handle peers that really left). A peer that said it left is positive evidence too: when
  // enough left that the majority is out of reach (say 2 of 4 leave together), the others'
  // round would otherwise wait for its matchmaking deadline. NetCollaboration ends the step
  // only while no group has formed.
  // And when at least as many peers moved past the epoch as are at it, this round is among the
  // laggards: even if it reached its majority, its members would then be behind and download
  // the state (seen: two late joiners held each other in a 15 s round while the others ran
  // 80 epochs ahead, and neither could serve the other's download meanwhile).
  const std::size_t need = running_->expected / 2 + 1;
  const std::size_t there = tracker_.peers_at(running_->epoch, now);
  const std::size_t ahead = tracker_.peers_ahead(running_->epoch, now);
  const bool laggards = ahead > 0 && ahead >= there;
  if ((running_->expected == 0 || there >= need) && !laggards) return;
  const bool left = tracker_.last_departure() >= running_->counted_at;
  if (ahead == 0 && !left) return;
  log()->info(
      "round {}: {} of the {} peers needed are at epoch {}, {} moved past it{}; abandoning it",
      running_->key, there, need, running_->epoch, ahead, left ? ", peers left" : "");
  collab_->abandon_round(running_->key);
  running_.reset();
}

awaitable<void> OptimizerIo::progress_loop() {
  for (;;) {
    if (run([](training::ProgressTracker& t) { return t.should_publish(Clock::now()); }))
      co_await publish_once();
    if (Clock::now() >= next_fetch_) co_await fetch_once();
    const Duration wait =
        std::clamp<Duration>(next_fetch_ - Clock::now(), Duration::zero(), kLoopTick);
    wake_.reset();
    using namespace asio::experimental::awaitable_operators;
    Timer timer(executor_, wait);
    auto r = co_await (timer.async_wait(use_nothrow) || wake_.wait());
    if (r.index() == 0 && std::get<0>(std::get<0>(r)) == asio::error::operation_aborted) co_return;
    if (r.index() == 1 && !std::get<1>(r)) co_return;  // cancelled
  }
}

result<void> OptimizerIo::stop(Duration timeout) {
  auto self = shared_from_this();
  auto r = wait_for_io<bool>(
      [self, timeout]() -> awaitable<result<bool>> {
        self->collab_->serve_state(nullptr);
        self->collab_->cancel_prepared_round();
        ST_CO_TRY(co_await self->scope_.close(timeout));
        // The last record says this peer left (and lives kLeavingTtl): the others stop
        // counting it (its samples, a majority that includes it) at their next fetch, and a
        // round that can no longer reach its majority without it ends (maybe_abandon_round).
        co_await self->publish_once(true);
        co_return true;
      },
      timeout + 5s, "optimizer shutdown", false);
  if (!r) return r.error();
  return success();
}

}  // namespace starling::optim
