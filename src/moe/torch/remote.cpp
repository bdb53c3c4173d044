// RemoteMixtureOfExperts: a DMoE layer whose experts are remote autograd calls (remote.hpp).
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include "moe/torch/tensor_data.hpp"
#include "starling/core/blocking.hpp"
#include "starling/core/log.hpp"
#include "starling/moe/remote.hpp"

namespace starling::moe {

namespace {

using torch::autograd::variable_list;

struct PlannedCall {
  ExpertAddress to;
  std::vector<std::int64_t> rows;   // sample index of each row
  std::vector<std::int64_t> slots;  // its slot (0..k-1)
  TensorData input;
  bool ok = false;
  std::uint64_t forward_step = 0;  // the expert's step in its forward answer
};

struct DispatchState {
  std::shared_ptr<net::Host> host;
  ExpertCallOptions opts;
  Duration backward_timeout;
  std::vector<PlannedCall> calls;
  std::int64_t batch = 0, in_features = 0;
  std::shared_ptr<std::mutex> stats_mu;
  std::shared_ptr<MoeStats> stats;
};

struct DispatchBackward : torch::autograd::Node {
  std::shared_ptr<DispatchState> st;
  std::string name() const override { return "RemoteMoeBackward"; }
  variable_list apply(variable_list&& grads) override {
    torch::Tensor g = grads[0].defined() ? grads[0].contiguous() : torch::Tensor();
    torch::Tensor gx = torch::zeros({st->batch, st->in_features});
    if (!g.defined()) return {gx};
    std::vector<CallFn> calls;
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < st->calls.size(); ++i) {
      auto& c = st->calls[i];
      if (!c.ok) continue;
      auto rows = torch::tensor(c.rows, torch::kLong);
      auto slots = torch::tensor(c.slots, torch::kLong);
      auto gd = to_data(g.index({rows, slots}));
      auto host = st->host;
      auto opts = st->opts;
      opts.timeout = st->backward_timeout;
      calls.push_back([host, to = c.to, input = c.input, gd, opts, step = c.forward_step]() {
        return call_backward(*host, to, input, gd, opts, step);
      });
      which.push_back(i);
    }
    auto results = run_calls(st->host->get_executor(), std::move(calls),
                             Clock::now() + st->backward_timeout + 1s);
    std::uint64_t failures = 0;
    for (std::size_t j = 0; j < results.size(); ++j) {
      auto& r = results[j];
      const auto& c = st->calls[which[j]];
      if (!r || !r->has_value() || r->value().tensor.shape.size() != 2 ||
          r->value().tensor.shape[0] != static_cast<std::int64_t>(c.rows.size()) ||
          r->value().tensor.shape[1] != st->in_features) {
        ++failures;
        if (r && !r->has_value())
          logger("moe")->debug("expert {} backward failed: {}", c.to.uid, r->error().message());
        continue;
      }
      auto rows = torch::tensor(c.rows, torch::kLong);
      gx.index_add_(0, rows, to_tensor(std::move(r->value().tensor)));
    }
    {
      std::lock_guard lk(*st->stats_mu);
      st->stats->backward_calls += results.size();
      st->stats->backward_failures += failures;
    }
    return {gx};
  }
};

}  // namespace

RemoteMixtureOfExpertsImpl::RemoteMixtureOfExpertsImpl(MoeOptions options,
                                                       std::shared_ptr<net::Host> host,
                                                       std::shared_ptr<ExpertDirectory> directory)
    : options_(std::move(options)),
      host_(std::move(host)),
      directory_(std::move(directory)),
      stats_mu_(std::make_shared<std::mutex>()),
      stats_(std::make_shared<MoeStats>()),
      replicas_(ReplicaChoiceOptions{.forget_after = options_.replica_forget_after,
                                     .avoid_failed = options_.avoid_failed}) {
  std::int64_t total = 0;
  for (auto g : options_.grid_size) total += g;
  proj = register_module("proj", torch::nn::Linear(options_.in_features, total));
}

MoeStats RemoteMixtureOfExpertsImpl::stats() const {
  std::lock_guard lk(*stats_mu_);
  return *stats_;
}

torch::Tensor RemoteMixtureOfExpertsImpl::forward(const torch::Tensor& x) {
  const TimePoint deadline = Clock::now() + options_.forward_timeout;
  if (x.dim() != 2 || x.size(1) != options_.in_features)
    throw std::runtime_error("RemoteMixtureOfExperts takes [B, " +
                             std::to_string(options_.in_features) + "], got " + shape_of(x));
  const std::int64_t B = x.size(0);
  const auto K = static_cast<std::int64_t>(options_.k);
  const std::size_t D = options_.grid_size.size();
  torch::Tensor logits = proj->forward(x);
  std::vector<torch::Tensor> dim_scores;
  std::int64_t off = 0;
  for (auto g : options_.grid_size) {
    dim_scores.push_back(logits.narrow(1, off, g));
    off += g;
  }
  // Beam search on the scores' values.
  std::vector<std::vector<std::vector<float>>> scores(B, std::vector<std::vector<float>>(D));
  {
    auto cpu = logits.detach().to(torch::kFloat32).contiguous();
    const float* p = cpu.data_ptr<float>();
    for (std::int64_t b = 0; b < B; ++b) {
      std::int64_t o = 0;
      for (std::size_t d = 0; d < D; ++d) {
        scores[b][d].assign(p + b * off + o, p + b * off + o + options_.grid_size[d]);
        o += options_.grid_size[d];
      }
    }
  }
  auto dir = directory_;
  auto grid = options_.grid;
  const std::size_t k = options_.k;
  const Duration search_time = std::max(Duration::zero(), deadline - Clock::now());
  auto found = block_on(
      host_->get_executor(),
      [dir, grid, scores, k, search_time]() mutable {
        return dir->beam_search(grid, std::move(scores), k, search_time);
      },
      search_time + 1s);
  if (!found) throw std::runtime_error("expert beam search: " + found.error().message());
  auto& chosen = found.value();

  // One call per chosen expert carrying every row routed to it.
  auto st = std::make_shared<DispatchState>();
  st->host = host_;
  st->opts.timeout = std::max(Duration(1ms), deadline - Clock::now());
  st->opts.codec = options_.codec;
  st->opts.response_codec = options_.response_codec;
  st->opts.stream_threshold = options_.stream_threshold;
  st->opts.answer_row = {options_.out_features};
  st->backward_timeout = options_.backward_timeout;
  st->batch = B;
  st->in_features = options_.in_features;
  st->stats_mu = stats_mu_;
  st->stats = stats_;
  std::map<std::string, std::size_t> call_of;
  std::vector<const std::vector<Declaration>*> servers_of;  // per call: the expert's replicas
  std::vector<std::vector<std::int64_t>> idx_v(D, std::vector<std::int64_t>(B * K, 0));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::size_t j = 0; j < chosen[b].size() && static_cast<std::int64_t>(j) < K; ++j) {
      const auto& e = chosen[b][j];
      auto uid = parse_uid(e.uid);
      if (!uid || uid.value().coords.size() != D || e.servers.empty()) continue;
      for (std::size_t d = 0; d < D; ++d) idx_v[d][b * K + j] = uid.value().coords[d];
      auto [it, fresh] = call_of.emplace(e.uid, st->calls.size());
      if (fresh) {
        st->calls.emplace_back().to.uid = e.uid;
        servers_of.push_back(&e.servers);
      }
      st->calls[it->second].rows.push_back(b);
      st->calls[it->second].slots.push_back(static_cast<std::int64_t>(j));
    }
  }
  // Each call to the replica expected to finish it first, the largest calls planned first.
  {
    std::vector<std::size_t> order(st->calls.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return st->calls[a].rows.size() > st->calls[b].rows.size();
    });
    replicas_.begin(Clock::now());
    for (auto i : order) {
      auto& c = st->calls[i];
      std::vector<std::string> peers;
      for (const auto& s : *servers_of[i]) peers.push_back(s.peer.to_string());
      const auto& server = (*servers_of[i])[replicas_.choose(c.to.uid, peers, c.rows.size())];
      c.to.peer = server.peer;
      c.to.addrs = server.addrs;
    }
  }
  auto xd = x.detach().to(torch::kFloat32).contiguous();
  for (auto& c : st->calls)
    c.input = to_data(xd.index_select(0, torch::tensor(c.rows, torch::kLong)));
  // Satisfied when every sample with experts has k_min answers (or all its calls failed).
  std::vector<std::vector<std::size_t>> calls_of_sample(B);
  for (std::size_t i = 0; i < st->calls.size(); ++i)
    for (auto r : st->calls[i].rows) calls_of_sample[r].push_back(i);
  const std::size_t k_min = std::max<std::size_t>(1, options_.k_min);
  torch::Tensor out3 = torch::zeros({B, K, options_.out_features});
  std::uint64_t failures = 0, late = 0, retries = 0;
  // Round 0 calls every expert; round 1 calls the experts whose call failed (not late) again
  // on another replica, if one is left and the deadline allows.
  std::vector<std::size_t> round_calls(st->calls.size());
  for (std::size_t i = 0; i < round_calls.size(); ++i) round_calls[i] = i;
  for (int round = 0; round < 2 && !round_calls.empty() && Clock::now() < deadline; ++round) {
    std::vector<CallFn> fns;
    for (auto i : round_calls)
      fns.push_back([host = host_, to = st->calls[i].to, input = st->calls[i].input,
                     opts = st->opts]() { return call_forward(*host, to, input, opts); });
    auto satisfied = [&](const std::vector<char>& ok_round) {
      std::vector<char> ok(st->calls.size());
      for (std::size_t i = 0; i < ok.size(); ++i) ok[i] = st->calls[i].ok;
      for (std::size_t j = 0; j < round_calls.size(); ++j) ok[round_calls[j]] = ok_round[j];
      for (const auto& cs : calls_of_sample) {
        if (cs.empty()) continue;
        std::size_t n = 0;
        for (auto i : cs) n += ok[i] ? 1 : 0;
        if (n < std::min(k_min, cs.size())) return false;
      }
      return true;
    };
    std::vector<Duration> elapsed;
    auto results = run_calls(host_->get_executor(), std::move(fns), deadline, satisfied,
                             options_.timeout_after_k_min, &elapsed);
    const TimePoint ended = Clock::now();
    std::vector<std::size_t> again;
    for (std::size_t j = 0; j < results.size(); ++j) {
      auto& c = st->calls[round_calls[j]];
      auto& r = results[j];
      const std::string peer = c.to.peer.to_string();
      if (!r) {
        ++late;
        replicas_.observe(peer, c.rows.size(), elapsed[j], ended);  // at least this slow
        replicas_.failed(c.to.uid, peer, ended);
        continue;
      }
      if (!r->has_value() || r->value().tensor.shape.size() != 2 ||
          r->value().tensor.shape[0] != static_cast<std::int64_t>(c.rows.size()) ||
          r->value().tensor.shape[1] != options_.out_features) {
        ++failures;
        replicas_.failed(c.to.uid, peer, ended);
        if (r->has_value())
          logger("moe")->debug("expert {} answered shape {}", c.to.uid,
                               describe_shape(r->value().tensor.shape));
        else
          logger("moe")->debug("expert {} failed: {}", c.to.uid, r->error().message());
        // Another replica that has not failed this expert?
        const auto& servers = *servers_of[round_calls[j]];
        std::vector<std::string> peers;
        for (const auto& sv : servers) peers.push_back(sv.peer.to_string());
        const auto& next = servers[replicas_.choose(c.to.uid, peers, c.rows.size())];
        if (next.peer != c.to.peer) {
          c.to.peer = next.peer;
          c.to.addrs = next.addrs;
          again.push_back(round_calls[j]);
        }
        continue;
      }
      c.ok = true;
      c.forward_step = r->value().expert_step;
      replicas_.observe(peer, c.rows.size(), elapsed[j], ended);
      auto rows = torch::tensor(c.rows, torch::kLong);
      auto slots = torch::tensor(c.slots, torch::kLong);
      out3.index_put_({rows, slots}, to_tensor(std::move(r->value().tensor)));
    }
    round_calls = std::move(again);
    if (round == 0) retries = round_calls.size();
  }
  torch::Tensor mask = torch::zeros({B, K}, torch::kBool);
  {
    std::vector<std::uint8_t> m(B * K, 0);
    for (const auto& c : st->calls)
      if (c.ok)
        for (std::size_t r = 0; r < c.rows.size(); ++r) m[c.rows[r] * K + c.slots[r]] = 1;
    mask = torch::from_blob(m.data(), {B, K}, torch::kUInt8).clone().to(torch::kBool);
  }
  {
    std::vector<torch::Tensor> per_dim;
    for (std::size_t d = 0; d < D; ++d)
      per_dim.push_back(torch::from_blob(idx_v[d].data(), {B, K}, torch::kLong).clone());
    last_coords = torch::stack(per_dim, 2);
    last_answered = mask;
  }
  std::uint64_t empty = 0;
  {
    auto any = mask.any(1);
    empty = static_cast<std::uint64_t>((~any).sum().item<std::int64_t>());
  }
  {
    std::lock_guard lk(*stats_mu_);
    stats_->forward_calls += st->calls.size() + retries;
    stats_->forward_retries += retries;
    stats_->forward_failures += failures;
    stats_->forward_late += late;
    stats_->empty_rows += empty;
    for (const auto& c : st->calls)
      if (c.ok) stats_->rows_per_expert[c.to.uid] += c.rows.size();
  }
  bool any_ok = false;
  for (const auto& c : st->calls) any_ok = any_ok || c.ok;
  if (!any_ok)
    throw std::runtime_error(
        "RemoteMixtureOfExperts: no expert answered (" + std::to_string(st->calls.size()) +
        " called, " + std::to_string(failures) + " failed, " + std::to_string(late) + " late)");
  if (torch::GradMode::is_enabled()) {
    auto node =
        std::shared_ptr<DispatchBackward>(new DispatchBackward(), torch::autograd::deleteNode);
    node->st = st;
    node->set_next_edges(torch::autograd::collect_next_edges(x));
    torch::autograd::set_history(out3, node);
  }
  // Gates: each slot's score is the sum of its coordinates' scores (differentiable).
  torch::Tensor gate = torch::zeros({B, K});
  for (std::size_t d = 0; d < D; ++d) {
    auto id = torch::from_blob(idx_v[d].data(), {B, K}, torch::kLong).clone();
    gate = gate + dim_scores[d].gather(1, id);
  }
  const auto neg_inf = -std::numeric_limits<float>::infinity();
  auto any = mask.any(1, /*keepdim=*/true);
  auto masked = gate.masked_fill(~mask, neg_inf);
  masked = torch::where(any, masked, torch::zeros_like(masked));
  auto weights = torch::softmax(masked, 1) * mask.to(torch::kFloat32);
  return (weights.unsqueeze(-1) * out3).sum(1);
}

}  // namespace starling::moe
