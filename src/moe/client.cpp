// Client calls of /starling/moe/1.0.0 (see client.hpp).
#include "starling/moe/client.hpp"

#include <condition_variable>
#include <mutex>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "moe/stream_call.hpp"
#include "starling/core/log.hpp"
#include "starling/moe/stream.hpp"
#include "starling/pb/moe.pb.h"

namespace starling::moe {

namespace {

net::CallOptions rpc_options(const ExpertCallOptions& o) {
  net::CallOptions c;
  c.timeout = o.timeout;
  c.max_message_size = o.max_message_size;
  return c;
}

void remember(net::Host& host, const ExpertAddress& to) {
  if (!to.addrs.empty()) host.add_addresses(to.peer, to.addrs);
}

result<void> add_tensor(const ExpertCallOptions& o, const TensorData& t, pb::ExpertRequest& req) {
  auto* m = req.add_tensors();
  return encode_tensor(o.codec, t.shape, t.values, *m);
}

awaitable<result<ExpertAnswer>> call(net::Host& host, ExpertAddress to, const char* protocol,
                                     pb::ExpertRequest req, ExpertCallOptions opts) {
  remember(host, to);
  net::RpcClient client(host);
  const auto copts = rpc_options(opts);
  auto resp = co_await client.unary<pb::ExpertRequest, pb::ExpertResponse>(to.peer, protocol,
                                                                           std::move(req), copts);
  if (!resp) co_return resp.error().with_context("expert " + to.uid);
  auto tensors = decode_response(resp.value(), opts.limits);
  if (!tensors) co_return tensors.error().with_context("expert " + to.uid + " answered");
  if (tensors.value().size() != 1)
    co_return Error(errc::protocol_violation, "expert " + to.uid + " answered " +
                                                  std::to_string(tensors.value().size()) +
                                                  " tensors, want 1");
  co_return ExpertAnswer{std::move(tensors.value().front()), resp.value().expert_step()};
}

}  // namespace

awaitable<result<ExpertSchema>> call_info(net::Host& host, ExpertAddress to,
                                          ExpertCallOptions opts) {
  remember(host, to);
  net::RpcClient client(host);
  pb::ExpertInfoRequest req;
  req.set_uid(to.uid);
  const auto copts = rpc_options(opts);
  auto resp = co_await client.unary<pb::ExpertInfoRequest, pb::ExpertInfo>(to.peer, kInfoProtocol,
                                                                           std::move(req), copts);
  if (!resp) co_return resp.error().with_context("expert " + to.uid + " info");
  co_return from_proto(resp.value(), opts.limits);
}

namespace {

// A streamed call when the tensors exceed the threshold; std::nullopt: send one message (small
// tensors, or a server without the stream methods and tensors that fit one message).
awaitable<std::optional<result<ExpertAnswer>>> maybe_streamed(
    net::Host& host, const ExpertAddress& to, bool backward, const std::vector<TensorData>& ts,
    const ExpertCallOptions& opts, std::optional<std::uint64_t> forward_step) {
  std::uint64_t values = 0;
  for (const auto& t : ts) values += t.values.size();
  if (!should_stream(values, opts.codec, opts.stream_threshold)) co_return std::nullopt;
  auto r = co_await detail::stream_call(host, to, backward, ts, opts, forward_step);
  if (r || !net::is_remote_error(r.error()) ||
      r.error().code() != net::make_error_code(net::rpc_errc::unimplemented))
    co_return r;
  if (should_stream(values, opts.codec, opts.max_message_size)) co_return r;
  logger("moe")->debug("expert {}: no stream methods at {}; one message instead", to.uid,
                       to.peer.short_string());
  co_return std::nullopt;
}

}  // namespace

awaitable<result<ExpertAnswer>> call_forward(net::Host& host, ExpertAddress to, TensorData input,
                                             ExpertCallOptions opts) {
  std::vector<TensorData> ts;
  ts.push_back(std::move(input));
  if (auto r = co_await maybe_streamed(host, to, false, ts, opts, std::nullopt)) co_return *r;
  pb::ExpertRequest req;
  req.set_uid(to.uid);
  req.set_response_codec(opts.response_codec);
  ST_CO_TRY(add_tensor(opts, ts[0], req));
  co_return co_await call(host, std::move(to), kForwardProtocol, std::move(req), std::move(opts));
}

awaitable<result<ExpertAnswer>> call_backward(net::Host& host, ExpertAddress to, TensorData input,
                                              TensorData grad_output, ExpertCallOptions opts,
                                              std::optional<std::uint64_t> forward_step) {
  std::vector<TensorData> ts;
  ts.push_back(std::move(input));
  ts.push_back(std::move(grad_output));
  if (auto r = co_await maybe_streamed(host, to, true, ts, opts, forward_step)) co_return *r;
  pb::ExpertRequest req;
  req.set_uid(to.uid);
  if (forward_step) req.set_forward_step(*forward_step);
  req.set_response_codec(opts.response_codec);
  ST_CO_TRY(add_tensor(opts, ts[0], req));
  ST_CO_TRY(add_tensor(opts, ts[1], req));
  co_return co_await call(host, std::move(to), kBackwardProtocol, std::move(req), std::move(opts));
}

namespace {

struct RunState {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::optional<result<ExpertAnswer>>> results;
  std::vector<Duration> elapsed;
  std::size_t left = 0;
};

awaitable<void> run_one(std::shared_ptr<RunState> st, std::size_t i, CallFn fn) {
  const TimePoint t0 = Clock::now();
  result<ExpertAnswer> r = Error(errc::internal, "expert call threw");
  try {
    r = co_await fn();
  } catch (const std::exception& e) {
    r = Error(errc::internal, std::string("expert call threw: ") + e.what());
  }
  std::lock_guard lock(st->mu);
  st->results[i] = std::move(r);
  st->elapsed[i] = Clock::now() - t0;
  --st->left;
  st->cv.notify_all();
}

}  // namespace

std::vector<std::optional<result<ExpertAnswer>>> run_calls(
    asio::any_io_executor ex, std::vector<CallFn> calls, TimePoint deadline,
    const std::function<bool(const std::vector<char>&)>& satisfied, Duration timeout_after_k_min,
    std::vector<Duration>* elapsed) {
  const TimePoint t0 = Clock::now();
  auto st = std::make_shared<RunState>();
  st->results.resize(calls.size());
  st->elapsed.resize(calls.size());
  st->left = calls.size();
  for (std::size_t i = 0; i < calls.size(); ++i)
    asio::co_spawn(ex, run_one(st, i, std::move(calls[i])), asio::detached);
  std::unique_lock lock(st->mu);
  std::optional<TimePoint> k_min_deadline;
  std::vector<char> ok(calls.size(), 0);
  for (;;) {
    if (st->left == 0) break;
    if (satisfied && !k_min_deadline) {
      for (std::size_t i = 0; i < ok.size(); ++i)
        ok[i] = st->results[i] && st->results[i]->has_value();
      if (satisfied(ok)) {
        const auto now = Clock::now();
        k_min_deadline =
            timeout_after_k_min >= deadline - now ? deadline : now + timeout_after_k_min;
      }
    }
    const TimePoint until = k_min_deadline ? std::min(*k_min_deadline, deadline) : deadline;
    if (Clock::now() >= until) break;
    st->cv.wait_until(lock, until);
  }
  if (elapsed) {
    *elapsed = st->elapsed;
    for (std::size_t i = 0; i < calls.size(); ++i)
      if (!st->results[i]) (*elapsed)[i] = Clock::now() - t0;
  }
  return st->results;  // a copy: late calls keep writing into st
}

}  // namespace starling::moe
