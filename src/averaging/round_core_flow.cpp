// RoundCore: the phase logic (reduce-scatter, per-part reduction and all-gather, fin barrier,
// recovery sub-rounds) and timers. See round_core.hpp and docs/averaging.md.
#include <algorithm>
#include <tuple>

#include "starling/averaging/round_core.hpp"
#include "starling/core/log.hpp"

namespace starling::averaging {

bool RoundCore::is_owner() const {
  return !sub_.plan.owned.empty() && sub_.plan.owned[self_] > 0;
}

void RoundCore::begin_subround(std::uint32_t index, std::vector<Segment> segments, Bitset alive,
                               TimePoint now) {
  auto plan = make_plan(segments, caps_, alive, cfg_.part_elems);
  if (!plan) {
    fail(plan.error().with_context("all-reduce: planning sub-round " + std::to_string(index)));
    return;
  }
  Sub s;
  s.index = index;
  s.alive = std::move(alive);
  s.plan = std::move(plan).value();
  const std::size_t nparts = s.plan.parts.size();
  for (std::uint32_t p = 0; p < nparts; ++p)
    if (s.plan.parts[p].owner == self_) s.my_parts.push_back(p);
  s.slots.assign(s.my_parts.size(), std::vector<FloatBuffer>(n_));
  s.have.assign(s.my_parts.size(), Bitset(n_));
  s.requested.assign(s.my_parts.size(), 0);
  s.reduced.assign(s.my_parts.size(), 0);
  s.mine_counted = Bitset(n_, true);
  s.owed.assign(n_, 0);
  for (std::uint32_t j = 0; j < n_; ++j)
    if (j != self_ && s.alive.test(j)) s.owed[j] = static_cast<std::uint32_t>(s.my_parts.size());
  s.got = Bitset(nparts);
  s.part_counted.assign(nparts, Bitset());
  s.fin1.assign(n_, std::nullopt);
  s.fin2.assign(n_, std::nullopt);
  sub_ = std::move(s);
  for (std::uint32_t j = 0; j < n_; ++j) {
    if (!sub_.alive.test(j)) failed_.set(j);
    last_activity_[j] = std::max(last_activity_[j], now);
  }
  if (index > 0)
    logger("averaging")
        ->info("all-reduce: sub-round {} re-reduces {} elements in {} parts without {}", index,
               sub_.plan.total, nparts, (~sub_.alive).to_string());
  send_parts();
  auto future = std::exchange(future_, {});
  held_bytes_ = 0;
  ahead_.clear();
  for (auto& b : future) {
    if (status_ != Status::running) break;
    if (failed_.test(b.from)) continue;
    auto r = handle(b.from, b.msg, now);
    if (!r) {
      logger("averaging")
          ->warn("all-reduce [member {}]: excluding {}: {}", self_, who(b.from),
                 r.error().message());
      mark_failed(b.from, r.error().message());
    }
  }
}

void RoundCore::send_parts() {
  if (local_pending_) return;  // provide_local() sends them
  const auto& parts = sub_.plan.parts;
  for (std::uint32_t p = 0; p < parts.size(); ++p) {
    const auto& spec = parts[p];
    if (spec.owner == self_ || failed_.test(spec.owner)) continue;
    send(spec.owner,
         PartMsg{sub_.index, p, local_.subspan(spec.begin, spec.size()), members_[self_].weight});
  }
}

// Every part of mine has been handed to a reduction.
bool RoundCore::rs_complete() const {
  return sub_.next_unrequested == sub_.my_parts.size();
}

// My part i has arrived from every sender I do not consider failed.
bool RoundCore::part_ready(std::size_t i) const {
  if (local_pending_) return false;  // our own values are not in yet
  for (std::uint32_t j = 0; j < n_; ++j) {
    if (j == self_ || !sub_.alive.test(j) || failed_.test(j)) continue;
    if (!sub_.have[i].test(j)) return false;
  }
  return true;
}

// Hands out a reduction for every part of mine that is ready: the part's tag is the senders
// it arrived from (and this member), summed in group order.
void RoundCore::start_reductions(TimePoint now) {
  Sub& s = sub_;
  while (s.next_unrequested < s.my_parts.size() && s.requested[s.next_unrequested])
    ++s.next_unrequested;
  std::vector<std::size_t> ready;
  for (std::size_t i = s.next_unrequested; i < s.my_parts.size(); ++i)
    if (!s.requested[i] && part_ready(i)) ready.push_back(i);
  for (auto i : ready) {
    const std::uint32_t p = s.my_parts[i];
    const auto& spec = s.plan.parts[p];
    Bitset tag = s.have[i];
    tag.set(self_);
    double total_w = 0;
    for (auto j : tag.indices()) total_w += weight_of(j);
    const double cnt = static_cast<double>(tag.count());
    ReduceJob job;
    job.subround = s.index;
    job.part = p;
    job.out = output_.subspan(spec.begin, spec.size());
    output_touched_ = true;
    for (auto j : tag.indices()) {
      job.inputs.push_back(j == self_ ? local_.subspan(spec.begin, spec.size())
                                      : std::span<const float>(s.slots[i][j]));
      job.coeffs.push_back(static_cast<float>(total_w > 0 ? weight_of(j) / total_w : 1.0 / cnt));
      job.weights.push_back(weight_of(j));
    }
    job.aggregation = cfg_.aggregation;
    s.part_counted[p] = std::move(tag);
    s.requested[i] = 1;
    if (cfg_.inline_reduce) {
      run_reduce_job(job);
      finish_part(i);
    } else {
      jobs_.push_back(std::move(job));
    }
  }
  while (s.next_unrequested < s.my_parts.size() && s.requested[s.next_unrequested])
    ++s.next_unrequested;
  if (s.index == 0 && rs_complete() && timings_.reduce_scatter_done == TimePoint{})
    timings_.reduce_scatter_done = now;
}

void RoundCore::on_reduced(std::uint32_t subround, std::uint32_t part, TimePoint now) {
  if (status_ != Status::running || subround != sub_.index) return;
  const std::uint32_t i = my_part_index(part);
  if (i >= sub_.my_parts.size() || sub_.my_parts[i] != part || !sub_.requested[i] ||
      sub_.reduced[i])
    return;  // a job of an earlier sub-round, or a repeat
  finish_part(i);
  advance(now);
}

// Part i of mine is reduced: it is held, its inputs are released, and it goes to every
// member at once.
void RoundCore::finish_part(std::size_t i) {
  Sub& s = sub_;
  const std::uint32_t p = s.my_parts[i];
  s.reduced[i] = 1;
  ++s.reduced_count;
  s.got.set(p);
  s.mine_counted &= s.part_counted[p];
  for (auto& b : s.slots[i]) b = FloatBuffer();
  for (std::uint32_t j = 0; j < n_; ++j)
    if (j != self_ && s.alive.test(j) && !failed_.test(j))
      send(j, ResultMsg{s.index, p, s.part_counted[p], part_output(p)});
}

bool RoundCore::gather_complete() const {
  const auto& parts = sub_.plan.parts;
  for (std::uint32_t p = 0; p < parts.size(); ++p) {
    if (sub_.got.test(p)) continue;
    const auto owner = parts[p].owner;
    if (owner == self_ || !failed_.test(owner)) return false;
  }
  return true;
}

bool RoundCore::fin1_complete() const {
  for (std::uint32_t j = 0; j < n_; ++j)
    if (sub_.alive.test(j) && !failed_.test(j) && !sub_.fin1[j]) return false;
  return true;
}

bool RoundCore::fin2_complete() const {
  for (std::uint32_t j = 0; j < n_; ++j)
    if (sub_.alive.test(j) && !members_[j].cap.client && !failed_.test(j) && !sub_.fin2[j])
      return false;
  return true;
}

void RoundCore::advance(TimePoint now) {
  bool progress = true;
  while (progress && status_ == Status::running) {
    progress = false;
    fail_closed_waits();
    Sub& s = sub_;
    const std::uint32_t index = s.index;
    if (is_owner() && !rs_complete()) {
      const std::size_t before = jobs_.size() + s.reduced_count;
      start_reductions(now);
      if (status_ != Status::running) return;
      progress = jobs_.size() + s.reduced_count != before;
    }
    if (!s.fin1_sent && gather_complete()) {
      FinReport mine{self_, ~s.got, failed_, blamed_, s.mine_counted};
      s.fin1_sent = true;
      if (index == 0) timings_.all_gather_done = now;
      for (std::uint32_t j = 0; j < n_; ++j) {
        if (!s.alive.test(j) || members_[j].cap.client) continue;
        if (j == self_)
          s.fin1[j] = mine;
        else if (!failed_.test(j))
          send(j, FinMsg{index, 1, {mine}});
      }
      progress = true;
    }
    if (!members_[self_].cap.client && s.fin1_sent && !s.fin2_sent && fin1_complete()) {
      std::vector<FinReport> heard;
      for (const auto& f : s.fin1)
        if (f) heard.push_back(*f);
      s.fin2_sent = true;
      for (std::uint32_t j = 0; j < n_; ++j) {
        if (!s.alive.test(j)) continue;
        if (j == self_)
          s.fin2[j] = heard;
        else if (!failed_.test(j))
          send(j, FinMsg{index, 2, heard});
      }
      progress = true;
    }
    if (s.fin1_sent && fin2_complete()) {
      decide(now);
      progress = true;
    }
  }
}

void RoundCore::tally(const Sub& s, const Bitset& missing) {
  for (std::uint32_t p = 0; p < s.plan.parts.size(); ++p) {
    if (missing.test(p) || !s.got.test(p)) continue;
    for (auto j : s.part_counted[p].indices()) counted_elems_[j] += s.plan.parts[p].size();
    coverage_.push_back({{s.plan.parts[p].begin, s.plan.parts[p].end},
                         s.part_counted[p],
                         s.index,
                         p,
                         s.plan.parts[p].owner});
  }
}

void RoundCore::decide(TimePoint now) {
  const std::size_t nparts = sub_.plan.parts.size();
  const std::string where = "all-reduce sub-round " + std::to_string(sub_.index);
  // Merge the Fin2s into one table by member (a union if two copies ever differ, so the
  // result does not depend on arrival order).
  std::vector<std::optional<FinReport>> table(n_);
  std::size_t heard = 0;
  for (const auto& f : sub_.fin2) {
    if (!f) continue;
    ++heard;
    for (const auto& r : *f) {
      auto& t = table[r.member];
      if (!t) {
        t = r;
      } else {
        t->missing |= r.missing;
        t->failed |= r.failed;
        t->blamed |= r.blamed;
        t->counted &= r.counted;
      }
    }
  }
  if (heard == 0) return fail(make_error(errc::unavailable, where + ": lost every non-client"));
  std::vector<bool> client;
  for (const auto& m : members_) client.push_back(m.cap.client);
  FinDecision d = decide_fin(table, sub_.alive, client, sub_.plan.parts);
  // Redo the missing parts and every part whose tag is not the agreed counted set, so that
  // all parts settled here count the same members.
  Bitset redo = d.missing;
  bool lost_here = false;  // a part this member lacks that the group does not redo
  for (std::uint32_t p = 0; p < nparts; ++p) {
    if (redo.test(p)) continue;
    if (!sub_.got.test(p))
      lost_here = true;
    else if (sub_.part_counted[p] != d.counted)
      redo.set(p);
  }
  if (redo.none() && !lost_here) {
    tally(sub_, redo);
    status_ = Status::done;
    timings_.finished = now;
    if (timings_.reduce_scatter_done == TimePoint{}) timings_.reduce_scatter_done = now;
    return;
  }
  Bitset alive = d.counted;
  alive &= ~d.excluded;
  if (!alive.test(self_))
    return fail(make_error(errc::unavailable, where + ": the group excluded this member"));
  if (lost_here)
    return fail(make_error(errc::unavailable,
                           where + ": this member lost parts the rest of the group keeps"));
  tally(sub_, redo);
  std::vector<Segment> segs;
  for (auto p : redo.indices()) segs.push_back({sub_.plan.parts[p].begin, sub_.plan.parts[p].end});
  begin_subround(sub_.index + 1, merge_segments(std::move(segs)), std::move(alive), now);
}

FinDecision decide_fin(const std::vector<std::optional<FinReport>>& reports, const Bitset& alive,
                       const std::vector<bool>& client, const std::vector<PartSpec>& parts) {
  const std::size_t n = reports.size();
  FinDecision d{Bitset(n), Bitset(parts.size()), alive};
  Bitset present(n);
  for (std::size_t j = 0; j < n; ++j)
    if (reports[j] && alive.test(j)) present.set(j);
  for (std::size_t j = 0; j < n; ++j)
    if (alive.test(j) && !present.test(j)) d.excluded.set(j);
  // Conflicts: two present members of which one saw the other fail, and that need a link
  // (at least one is a non-client). Exclude greedily until none is left, choosing by
  // (blamed for malformed data by a present member, number of present accusers, number of
  // conflicts, index), largest first: a crashed member is accused by all who noticed, its
  // accusers by nobody. Deterministic, so every member picks the same ones.
  std::vector<std::vector<bool>> edge(n, std::vector<bool>(n, false));
  std::vector<bool> blamed(n, false);
  std::vector<std::size_t> accusers(n, 0);
  for (std::size_t a = 0; a < n; ++a) {
    if (!present.test(a)) continue;
    for (std::size_t b = 0; b < n; ++b) {
      if (b == a || !present.test(b) || !reports[a]->failed.test(b)) continue;
      if (client[a] && client[b]) continue;
      edge[a][b] = edge[b][a] = true;
      ++accusers[b];
      if (reports[a]->blamed.test(b)) blamed[b] = true;
    }
  }
  for (;;) {
    std::size_t best = n;
    std::tuple<bool, std::size_t, std::size_t, std::size_t> best_key{};
    for (std::size_t x = 0; x < n; ++x) {
      if (d.excluded.test(x)) continue;
      std::size_t deg = 0;
      for (std::size_t y = 0; y < n; ++y)
        if (edge[x][y] && !d.excluded.test(y)) ++deg;
      if (deg == 0) continue;
      const auto key = std::make_tuple(static_cast<bool>(blamed[x]), accusers[x], deg, x);
      if (best == n || key > best_key) {
        best = x;
        best_key = key;
      }
    }
    if (best == n) break;
    d.excluded.set(best);
  }
  for (std::size_t j = 0; j < n; ++j) {
    if (!present.test(j) || d.excluded.test(j)) continue;
    d.missing |= reports[j]->missing;
    d.counted &= reports[j]->counted;
  }
  // Every part still missing has an excluded owner: a member that stays and lacks a part saw
  // its owner fail, which is a conflict the cover resolved by excluding one of the two. That
  // owner's values of its own parts are gone, so it is counted nowhere. Every member that an
  // owner that stays left out of a tag is excluded too (the owner saw it fail: a conflict).
  for (auto p : d.missing.indices()) d.counted.reset(parts[p].owner);
  return d;
}

Bitset RoundCore::waiting_on() const {
  Bitset w(n_);
  if (status_ != Status::running) return w;
  auto want = [&](std::uint32_t j) {
    if (j != self_ && !failed_.test(j)) w.set(j);
  };
  const Sub& s = sub_;
  if (is_owner() && !rs_complete())
    for (std::uint32_t j = 0; j < n_; ++j)
      if (s.alive.test(j) && s.owed[j] > 0) want(j);
  if (!s.fin1_sent) {
    for (std::uint32_t p = 0; p < s.plan.parts.size(); ++p)
      if (!s.got.test(p)) want(s.plan.parts[p].owner);
  } else {
    if (!members_[self_].cap.client && !s.fin2_sent)
      for (std::uint32_t j = 0; j < n_; ++j)
        if (s.alive.test(j) && !s.fin1[j]) want(j);
    for (std::uint32_t j = 0; j < n_; ++j)
      if (s.alive.test(j) && !members_[j].cap.client && !s.fin2[j]) want(j);
  }
  return w;
}

// A peer that closed cleanly sends nothing more: waiting on it would only end in a stall.
void RoundCore::fail_closed_waits() {
  if (closed_.none()) return;
  Bitset w = waiting_on();
  w &= closed_;
  for (auto j : w.indices()) mark_failed(j, "closed its streams before sending what we wait for");
}

void RoundCore::tick(TimePoint now) {
  if (status_ != Status::running) return;
  if (now >= deadline_) {
    fail(make_error(errc::timeout, "all-reduce: deadline passed in sub-round " +
                                       std::to_string(sub_.index) + " (" + phase() + ")"));
    return;
  }
  for (auto j : waiting_on().indices())
    if (now - last_activity_[j] >= cfg_.stall_timeout)
      mark_failed(j, "no activity for " +
                         std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            now - last_activity_[j])
                                            .count()) +
                         " ms");
  advance(now);
}

TimePoint RoundCore::next_wakeup() const {
  if (status_ != Status::running) return TimePoint::max();
  TimePoint t = deadline_;
  for (auto j : waiting_on().indices()) t = std::min(t, last_activity_[j] + cfg_.stall_timeout);
  return t;
}

std::string RoundCore::phase() const {
  if (status_ == Status::done) return "done";
  if (status_ == Status::failed) return "failed";
  if (!sub_.fin1_sent) {
    if (is_owner() && !rs_complete()) return "reduce-scatter";
    return "all-gather";
  }
  return "fin";
}

}  // namespace starling::averaging
