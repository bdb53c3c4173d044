// Test support: a discrete-event simulation of many RoundCores exchanging messages with random
// delays (no ordering between messages), crashes with or without a transport notice, partial
// broadcasts by a crashing member, and message mutation (malformed data).
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "starling/averaging/round_core.hpp"

namespace starling::averaging::test {

struct SimOptions {
  std::size_t n = 4;
  std::vector<bool> clients;      // default: none
  std::vector<double> weights;    // default: random in [0.5, 3]
  std::vector<std::uint64_t> bw;  // default: random
  std::size_t elems = 3000;
  std::size_t part_elems = 97;
  std::uint64_t seed = 1;
  Duration stall_timeout = 2s;
  Duration deadline = 120s;
  bool inline_reduce = true;
  // A member that finishes (done or failed) ends its streams cleanly: every peer it talks to
  // gets on_peer_closed() after the member's last messages (a stream's EOF follows its data).
  bool close_when_finished = false;
  AggregationConfig aggregation;  // how owners reduce their parts
  // Members' values (default: uniform in [-1, 1]); when given, one vector of `elems` per member.
  std::vector<std::vector<float>> locals;
};

class RoundSim {
 public:
  explicit RoundSim(SimOptions o) : o_(std::move(o)), rng_(o_.seed) {
    const std::size_t n = o_.n;
    if (o_.clients.empty()) o_.clients.assign(n, false);
    std::uniform_real_distribution<double> wd(0.5, 3.0);
    if (o_.weights.empty())
      for (std::size_t i = 0; i < n; ++i) o_.weights.push_back(wd(rng_));
    if (o_.bw.empty())
      for (std::size_t i = 0; i < n; ++i) o_.bw.push_back(100 + rng_() % 1000);
    std::vector<RoundMember> members;
    for (std::size_t i = 0; i < n; ++i)
      members.push_back({{o_.bw[i], static_cast<bool>(o_.clients[i])}, o_.weights[i]});
    std::uniform_real_distribution<float> vd(-1.0f, 1.0f);
    locals_.resize(n);
    outputs_.resize(n);
    crashed_.assign(n, false);
    for (std::size_t i = 0; i < n; ++i) {
      locals_[i].resize(o_.elems);
      for (auto& v : locals_[i]) v = vd(rng_);
      if (i < o_.locals.size()) locals_[i] = o_.locals[i];
      outputs_[i].assign(o_.elems, std::numeric_limits<float>::quiet_NaN());
    }
    RoundConfig cfg;
    cfg.part_elems = o_.part_elems;
    cfg.stall_timeout = o_.stall_timeout;
    cfg.inline_reduce = o_.inline_reduce;
    cfg.aggregation = o_.aggregation;
    for (std::size_t i = 0; i < n; ++i)
      cores_.push_back(std::make_unique<RoundCore>(members, static_cast<std::uint32_t>(i),
                                                   locals_[i], outputs_[i], cfg, now_,
                                                   now_ + o_.deadline));
    members_ = members;
  }

  // Crash member x at time offset `at` (notice: peers get on_peer_failed after 5 ms, like a
  // TCP reset; otherwise it just goes silent). Half its messages still in flight are lost.
  void kill_at(std::uint32_t x, Duration at, bool notice) {
    push(now_ + at, [this, x, notice] { crash(x, notice); });
  }
  // Crash member x right after it enters `phase` and has sent what that step produced.
  void kill_on_phase(std::uint32_t x, std::string phase, bool notice) {
    phase_kills_.push_back({x, std::move(phase), notice});
  }
  // Member x stops at time offset `at` and ends its streams cleanly (no reset): peers get
  // on_peer_closed() after its last messages.
  void close_at(std::uint32_t x, Duration at) {
    push(now_ + at, [this, x] {
      if (crashed_[x]) return;
      crashed_[x] = true;
      notify_closed(x);
    });
  }
  // Mutates messages as they are sent (return false to drop the message).
  std::function<bool(std::uint32_t from, std::uint32_t to, RoundMessage&, std::vector<float>&)>
      mutate;

  void run() {
    for (std::uint32_t i = 0; i < cores_.size(); ++i) {
      auto r = cores_[i]->start(now_);
      if (!r) throw std::runtime_error(r.error().message());
      after(i);
    }
    const TimePoint limit = now_ + o_.deadline + 10s;
    while (!events_.empty() && !all_finished()) {
      auto it = events_.begin();
      now_ = it->first.first;
      if (now_ > limit) break;
      auto fn = std::move(it->second);
      events_.erase(it);
      fn();
    }
    elapsed_ = now_ - start_;
  }

  RoundCore& core(std::uint32_t i) { return *cores_[i]; }
  bool crashed(std::uint32_t i) const { return crashed_[i]; }
  const std::vector<float>& output(std::uint32_t i) const { return outputs_[i]; }
  const std::vector<float>& local(std::uint32_t i) const { return locals_[i]; }
  const std::vector<RoundMember>& members() const { return members_; }
  Duration elapsed() const { return elapsed_; }
  std::size_t n() const { return cores_.size(); }

 private:
  using Key = std::pair<TimePoint, std::uint64_t>;
  void push(TimePoint t, std::function<void()> fn) {
    events_.emplace(Key{t, seq_++}, std::move(fn));
  }

  bool all_finished() const {
    for (std::size_t i = 0; i < cores_.size(); ++i)
      if (!crashed_[i] && cores_[i]->status() == RoundCore::Status::running) return false;
    return true;
  }

  bool cut(std::uint32_t a, std::uint32_t b) const {
    return cut_.count({std::min(a, b), std::max(a, b)}) > 0;
  }

  void touch(std::uint32_t i) {
    // Perfect keepalives: every live member is active as seen by every other it is connected to.
    for (std::uint32_t k = 0; k < cores_.size(); ++k)
      if (k != i && !crashed_[k] && !cut(i, k)) cores_[i]->on_activity(k, now_);
  }

  void after(std::uint32_t i) {
    if (crashed_[i]) return;
    // Like the real driver: a member that marks a peer failed closes its streams to it, so the
    // peer learns it too and nothing more flows between them.
    const Bitset& f = cores_[i]->failed();
    for (std::uint32_t k = 0; k < cores_.size(); ++k) {
      if (k == i || !f.test(k) || cut(i, k)) continue;
      cut_.insert({std::min(i, k), std::max(i, k)});
      if (crashed_[k]) continue;
      push(now_ + 5ms, [this, k, i] {
        if (crashed_[k]) return;
        touch(k);
        cores_[k]->on_peer_failed(i, "stream reset by peer", now_);
        after(k);
      });
    }
    for (auto& env : cores_[i]->take_outbox()) send(i, env);
    if (o_.close_when_finished && cores_[i]->status() != RoundCore::Status::running &&
        !closed_.count(i)) {
      closed_.insert(i);
      notify_closed(i);
    }
    const TimePoint w = cores_[i]->next_wakeup();
    if (w != TimePoint::max() && (!wake_[i] || *wake_[i] > w || *wake_[i] <= now_)) {
      wake_[i] = w;
      push(w, [this, i, w] {
        if (wake_[i] == w) wake_[i].reset();
        if (crashed_[i]) return;
        touch(i);
        cores_[i]->tick(now_);
        after(i);
      });
    }
    static const std::vector<std::string> order{"reduce-scatter", "all-gather", "fin"};
    auto rank = [&](const std::string& p) {
      return std::find(order.begin(), order.end(), p) - order.begin();
    };
    for (auto& pk : phase_kills_)
      if (pk.x == i && !pk.done && cores_[i]->status() == RoundCore::Status::running &&
          rank(cores_[i]->phase()) >= rank(pk.phase)) {
        pk.done = true;
        crash(i, pk.notice);
      }
  }

  void send(std::uint32_t from, const Envelope& env) {
    auto data = std::make_shared<std::vector<float>>();
    RoundMessage msg = env.msg;
    if (auto* p = std::get_if<PartMsg>(&msg)) data->assign(p->data.begin(), p->data.end());
    if (auto* r = std::get_if<ResultMsg>(&msg)) data->assign(r->data.begin(), r->data.end());
    if (mutate && !mutate(from, env.to, msg, *data)) return;
    const std::uint32_t to = env.to;
    const auto delay = std::chrono::microseconds(100 + rng_() % 5000);
    const std::uint64_t id = next_msg_++;
    inflight_[id] = from;
    push(now_ + delay, [this, from, to, msg, data, id]() mutable {
      if (!inflight_.erase(id)) return;  // lost with its crashing sender
      if (crashed_[to] || cut(from, to)) return;
      if (auto* p = std::get_if<PartMsg>(&msg)) p->data = *data;
      if (auto* r = std::get_if<ResultMsg>(&msg)) r->data = *data;
      touch(to);
      (void)cores_[to]->on_message(from, msg, now_);
      after(to);
    });
  }

  // After every message x sent so far has been delivered (delays are below 6 ms).
  void notify_closed(std::uint32_t x) {
    for (std::uint32_t k = 0; k < cores_.size(); ++k) {
      if (k == x || (members_[k].cap.client && members_[x].cap.client)) continue;
      push(now_ + 6ms, [this, k, x] {
        if (crashed_[k] || cut(x, k)) return;
        touch(k);
        cores_[k]->on_peer_closed(x, now_);
        after(k);
      });
    }
  }

  void crash(std::uint32_t x, bool notice) {
    if (crashed_[x]) return;
    crashed_[x] = true;
    for (auto it = inflight_.begin(); it != inflight_.end();)
      it = (it->second == x && rng_() % 2) ? inflight_.erase(it) : std::next(it);
    if (!notice) return;
    for (std::uint32_t k = 0; k < cores_.size(); ++k) {
      if (k == x || (members_[k].cap.client && members_[x].cap.client)) continue;
      push(now_ + 5ms, [this, k, x] {
        if (crashed_[k]) return;
        touch(k);
        cores_[k]->on_peer_failed(x, "connection reset", now_);
        after(k);
      });
    }
  }

  struct PhaseKill {
    std::uint32_t x;
    std::string phase;
    bool notice;
    bool done = false;
  };

  SimOptions o_;
  std::mt19937_64 rng_;
  TimePoint start_ = TimePoint{} + 1h;
  TimePoint now_ = start_;
  Duration elapsed_{};
  std::vector<RoundMember> members_;
  std::vector<std::vector<float>> locals_, outputs_;
  std::vector<std::unique_ptr<RoundCore>> cores_;
  std::vector<bool> crashed_;
  std::map<std::uint32_t, std::optional<TimePoint>> wake_;
  std::map<Key, std::function<void()>> events_;
  std::uint64_t seq_ = 0, next_msg_ = 0;
  std::map<std::uint64_t, std::uint32_t> inflight_;
  std::set<std::pair<std::uint32_t, std::uint32_t>> cut_;
  std::set<std::uint32_t> closed_;  // members whose clean close was sent
  std::vector<PhaseKill> phase_kills_;
};

}  // namespace starling::averaging::test
