// Test double of the Collaboration seam: peers in one process share a Hub that plays the DHT
// (progress records with ttl) and the averager (rounds keyed by name, weighted averages,
// state download from the peer at the highest epoch). Each peer has its own io_context thread,
// as in a real node; the Hub is shared between those threads and therefore locked (test code).
#pragma once

#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "starling/crypto/keys.hpp"
#include "starling/training/collaboration.hpp"
#include "starling/training/progress.hpp"

namespace starling::test {

class Hub {
 public:
  // A round closes when every live peer has joined it, or `window` after its first joiner.
  // rounds_closed counts the rounds that formed a group (two or more members).
  explicit Hub(Duration window = 1s) : window_(window) {}

  struct Participant {
    net::PeerId peer;
    training::RoundData data;
    double weight;
    asio::any_io_executor ex;
    std::shared_ptr<AsyncEvent> done;
    std::shared_ptr<result<training::RoundResult>> out;
  };
  struct Round {
    std::vector<Participant> members;
    TimePoint first_join;
    bool closed = false;
  };
  struct Provider {
    asio::any_io_executor ex;
    using Fn = std::function<awaitable<result<training::Collaboration::State>>()>;
    Fn fn;
  };

  std::mutex mu;
  std::map<net::PeerId, std::pair<Bytes, std::pair<TimePoint, Duration>>> records;
  std::map<std::string, Round> rounds;
  std::set<net::PeerId> live;
  std::map<net::PeerId, Provider> providers;
  std::map<net::PeerId, std::uint64_t> bytes_sent;
  Duration window_;
  std::uint64_t rounds_closed = 0;

  // Peers in round `key` now (0 if it never opened).
  std::size_t members_of(const std::string& key) {
    std::lock_guard lk(mu);
    auto it = rounds.find(key);
    return it == rounds.end() ? 0 : it->second.members.size();
  }

  // Closes `key` (mu held): averages, writes back, wakes everyone.
  void close_round(const std::string& key) {
    auto& r = rounds[key];
    if (r.closed) return;
    if (r.members.empty()) {
      rounds.erase(key);
      return;
    }
    r.closed = true;
    const bool alone = r.members.size() < 2;
    if (!alone) ++rounds_closed;
    double total = 0;
    for (auto& m : r.members) total += m.weight;
    const std::size_t k = r.members.size();
    training::RoundResult res;
    for (auto& m : r.members) res.members.push_back({m.peer, m.weight});
    res.total_weight = total;
    const std::size_t n = r.members.front().data.input.size();
    const std::uint64_t floats = n;
    std::vector<double> sum(n, 0.0);
    for (auto& m : r.members) {
      const double w = total > 0 ? m.weight / total : 1.0 / static_cast<double>(k);
      for (std::size_t i = 0; i < n; ++i) sum[i] += w * m.data.input[i];
    }
    for (auto& m : r.members)
      for (std::size_t i = 0; i < n; ++i) m.data.output[i] = static_cast<float>(sum[i]);
    // What a butterfly all-reduce would move: each peer sends (k-1)/k of its data out and
    // receives the same back, twice (reduce-scatter + all-gather).
    res.bytes_sent = res.bytes_received = k > 1 ? 2 * floats * 4 * (k - 1) / k : 0;
    for (auto& m : r.members) {
      bytes_sent[m.peer] += res.bytes_sent;
      *m.out = res;
      asio::post(m.ex, [ev = m.done] { ev->set(); });
    }
    // Keep nothing of the peers (their events belong to their io_contexts).
    r.members.clear();
    // Nobody else came: like a real averager's next matchmaking attempt, the key is open again
    // (a round that formed a group stays over for late joiners).
    if (alone) rounds.erase(key);
  }
};

class FakeCollaboration : public training::Collaboration {
 public:
  FakeCollaboration(std::shared_ptr<Hub> hub, asio::any_io_executor ex)
      : hub_(std::move(hub)),
        ex_(std::move(ex)),
        self_(net::PeerId::from_public_key(crypto::KeyPair::generate().public_key())) {
    std::lock_guard lk(hub_->mu);
    hub_->live.insert(self_);
  }
  ~FakeCollaboration() override { leave(); }

  // Simulates this peer dying: its records stay (until stale), it stops serving and rounds
  // no longer wait for it.
  void leave() {
    dead_ = true;
    std::lock_guard lk(hub_->mu);
    hub_->live.erase(self_);
    hub_->providers.erase(self_);
  }

  asio::any_io_executor executor() override { return ex_; }
  const net::PeerId& self() const override { return self_; }

  awaitable<result<void>> publish_progress(Bytes value, Duration ttl) override {
    if (dead_) co_return make_error(errc::closed, "dead");
    std::lock_guard lk(hub_->mu);
    hub_->records[self_] = {std::move(value), {Clock::now(), ttl}};
    co_return success();
  }
  awaitable<result<std::vector<training::ProgressEntry>>> fetch_progress() override {
    std::vector<training::ProgressEntry> out;
    std::lock_guard lk(hub_->mu);
    const auto now = Clock::now();
    for (auto& [peer, v] : hub_->records) {
      const Duration stored = now - v.second.first;
      if (stored >= v.second.second) continue;  // expired
      out.push_back({peer, v.first, v.second.second - stored});
    }
    co_return out;
  }

  // Early matchmaking, as NetCollaboration counts it: the Hub forms groups when the data
  // comes, so a prepared round only records its plan; average() with its key uses it, any
  // other key (or cancel) drops it.
  void prepare_round(const training::RoundPlan& plan) override {
    if (dead_) return;
    std::lock_guard lk(early_mu_);
    if (prepared_ && prepared_->options.key == plan.options.key) return;
    if (prepared_) ++early_.cancelled;
    prepared_ = plan;
    ++early_.prepared;
    plans_.push_back(plan);
  }
  void cancel_prepared_round() override {
    std::lock_guard lk(early_mu_);
    if (prepared_) ++early_.cancelled;
    prepared_.reset();
  }
  struct EarlyStats {
    std::uint64_t prepared = 0, used = 0, cancelled = 0;
  };
  EarlyStats early_stats() const {
    std::lock_guard lk(early_mu_);
    return early_;
  }
  std::vector<training::RoundPlan> plans() const {
    std::lock_guard lk(early_mu_);
    return plans_;
  }

  awaitable<result<training::RoundResult>> average(training::RoundData data,
                                                   training::RoundOptions options) override {
    if (dead_) co_return make_error(errc::closed, "dead");
    ST_CO_TRY(training::check_round_data(data));
    bool early = false;
    {
      std::lock_guard lk(early_mu_);
      early = prepared_ && prepared_->options.key == options.key;
      if (early)
        ++early_.used;
      else if (prepared_)
        ++early_.cancelled;
      prepared_.reset();
    }
    auto r = co_await average_now(std::move(data), std::move(options));
    if (r) r.value().early = early;
    co_return r;
  }

 private:
  // Removes one participant from its round while the round is open (RAII, see average_now).
  struct Departure {
    std::shared_ptr<Hub> hub;
    std::string key;
    std::shared_ptr<AsyncEvent> done;
    void now() {
      if (!hub) return;
      std::lock_guard lk(hub->mu);
      auto it = hub->rounds.find(key);
      if (it != hub->rounds.end() && !it->second.closed)
        std::erase_if(it->second.members,
                      [&](const Hub::Participant& p) { return p.done == done; });
      hub.reset();
    }
    ~Departure() { now(); }
  };

  awaitable<result<training::RoundResult>> average_now(training::RoundData data,
                                                       training::RoundOptions options) {
    auto done = std::make_shared<AsyncEvent>(ex_);
    auto out = std::make_shared<result<training::RoundResult>>(make_error(errc::internal));
    bool first = false;
    {
      std::lock_guard lk(hub_->mu);
      auto& r = hub_->rounds[options.key];
      if (r.closed) co_return make_error(errc::unavailable, "round " + options.key + " is over");
      first = r.members.empty();
      if (first) r.first_join = Clock::now();
      if (!r.members.empty() && r.members.front().data.input.size() != data.input.size())
        co_return make_error(errc::invalid_argument, "round " + options.key + ": other sizes");
      r.members.push_back({self_, std::move(data), options.weight, ex_, done, out});
      std::size_t live_members = 0;
      for (auto& m : r.members) live_members += hub_->live.count(m.peer);
      if (live_members >= hub_->live.size()) hub_->close_round(options.key);
    }
    // However this coroutine ends before the round closed (timeout, cancellation, an
    // exception at a co_await after cancellation, or its frame destroyed with its io_context),
    // it leaves the round first: nobody may write into our spans or post to our executor later.
    Departure leave{hub_, options.key, done};
    // The first joiner closes the round when the window ends; everyone waits until closed.
    const TimePoint until = first ? Clock::now() + hub_->window_ : options.deadline;
    const std::string what = "round " + options.key;
    auto w =
        co_await with_timeout(done->wait(), std::max<Duration>(until - Clock::now(), 1ms), what);
    if (!w && first) {
      if (w.error() == errc::cancelled) {
        leave.now();  // the others still average without us
        std::lock_guard lk(hub_->mu);
        hub_->close_round(options.key);
        co_return w.error();
      }
      std::lock_guard lk(hub_->mu);
      hub_->close_round(options.key);
    }
    if (!w && w.error() == errc::cancelled && !done->is_set()) co_return w.error();
    if (!done->is_set()) {
      auto w2 = co_await with_timeout(
          done->wait(), std::max<Duration>(options.deadline - Clock::now(), 1ms), what);
      if (!w2 && !done->is_set()) co_return w2.error();
    }
    co_return *out;
  }

 public:
  // From the peer whose record has want_digest if any, else the one at the highest epoch.
  awaitable<result<State>> download_state(TimePoint deadline, std::uint64_t want_digest) override {
    Hub::Provider best;
    {
      std::lock_guard lk(hub_->mu);
      std::pair<bool, std::uint64_t> best_rank{false, 0};
      for (auto& [peer, prov] : hub_->providers) {
        if (peer == self_) continue;
        auto it = hub_->records.find(peer);
        if (it == hub_->records.end()) continue;
        auto rec = training::decode_progress(it->second.first);
        if (!rec) continue;
        const std::pair<bool, std::uint64_t> rank{
            want_digest != 0 && rec.value().digest == want_digest, rec.value().epoch};
        if (!best.fn || rank >= best_rank) {
          best = prov;
          best_rank = rank;
        }
      }
    }
    if (!best.fn) co_return make_error(errc::unavailable, "no peer serves state");
    auto call = call_provider(std::make_shared<Provider::Fn>(best.fn));
    auto r = co_await asio::co_spawn(best.ex, std::move(call), asio::use_awaitable);
    if (!r) co_return make_error(errc::internal, "provider failed");
    if (*r) downloads_bytes_ += r->value().bytes.size();
    co_return std::move(*r);
  }

  void serve_state(std::function<awaitable<result<State>>()> provider) override {
    std::lock_guard lk(hub_->mu);
    if (provider && hub_->live.count(self_))
      hub_->providers[self_] = {ex_, std::move(provider)};
    else
      hub_->providers.erase(self_);
  }

  std::uint64_t bytes_sent() const override {
    std::lock_guard lk(hub_->mu);
    auto it = hub_->bytes_sent.find(self_);
    return it == hub_->bytes_sent.end() ? 0 : it->second;
  }

 private:
  using Provider = Hub::Provider;
  // Runs a provider on its own peer's executor (a named coroutine: its parameter lives in
  // the frame, unlike a lambda's captures).
  static awaitable<std::optional<result<State>>> call_provider(std::shared_ptr<Provider::Fn> fn) {
    co_return co_await (*fn)();
  }

  std::shared_ptr<Hub> hub_;
  asio::any_io_executor ex_;
  net::PeerId self_;
  std::uint64_t downloads_bytes_ = 0;
  mutable std::mutex early_mu_;  // the training thread reads the counters
  std::optional<training::RoundPlan> prepared_;
  std::vector<training::RoundPlan> plans_;
  EarlyStats early_;
  std::atomic<bool> dead_{false};
};

// An io_context with its own thread (a node's io thread).
class IoThread {
 public:
  IoThread() : work_(asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}
  ~IoThread() {
    work_.reset();
    io_.stop();
    thread_.join();
  }
  asio::any_io_executor executor() { return io_.get_executor(); }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
};

}  // namespace starling::test
