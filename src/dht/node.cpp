// DhtNode: lifecycle, the driver (pump + timer), requests out and requests in.
#include "starling/dht/node.hpp"

#include <google/protobuf/wrappers.pb.h>

#include "dht_log.hpp"
#include "starling/dht/channel.hpp"

namespace starling::dht {

using google::protobuf::BytesValue;

struct DhtNode::Waiter {
  explicit Waiter(asio::any_io_executor ex) : done(std::move(ex)) {}
  AsyncEvent done;
  std::optional<OpResult> result;
};

namespace {
std::uint64_t seed_of(const DhtNodeConfig& cfg) {
  if (cfg.seed) return cfg.seed;
  std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd();
}
}  // namespace

result<Bytes> answer_request(DhtCore& core, const net::PeerId& from, BytesView request,
                             const Now& now) {
  ST_TRY(auto req, decode_request(request, core.config().limits));
  return encode(core.handle_request(from, req, now));
}

result<void> accept_response(DhtCore& core, RequestId id, BytesView response, const Now& now) {
  auto decoded = decode_response(response, core.config().limits);
  if (!decoded) {
    core.on_failure(id, decoded.error(), now);
    return decoded.error();
  }
  core.on_response(id, decoded.value(), now);
  return success();
}

std::shared_ptr<DhtNode> DhtNode::create(std::shared_ptr<net::Host> host, DhtNodeConfig cfg) {
  return std::shared_ptr<DhtNode>(new DhtNode(std::move(host), std::move(cfg)));
}

DhtNode::DhtNode(std::shared_ptr<net::Host> host, DhtNodeConfig cfg)
    : host_(std::move(host)),
      cfg_(std::move(cfg)),
      core_(cfg_.dht, host_->local_peer(), cfg_.validators, seed_of(cfg_), Clock::now()),
      client_(*host_),
      scope_(host_->get_executor()),
      timer_(host_->get_executor()) {
  core_.set_connected_hint([h = host_.get()](const net::PeerId& p) { return h->is_connected(p); });
  // Background dials (refresh rounds after the join's first batch) within the warm bound.
  core_.set_background_dials_hint([h = host_.get(), warm = cfg_.warm_connections] {
    return warm == 0 || h->connection_count() < 2 * warm;
  });
  configured_client_ = cfg_.dht.client_mode;
}

void DhtNode::refresh_addresses() {
  if (!started_) return;
  std::vector<Bytes> addrs;
  for (const auto& a : announced()) addrs.push_back(a.to_bytes());
  core_.set_addresses(std::move(addrs));
}

void DhtNode::set_reachable(bool reachable) {
  if (configured_client_ || cfg_.dht.client_mode == !reachable) return;
  cfg_.dht.client_mode = !reachable;
  core_.set_client_mode(!reachable);
  refresh_addresses();
  dht_log().info("dht node {}: {} mode ({})", peer().short_string(),
                 reachable ? "server" : "client",
                 reachable ? "publicly reachable again" : "not publicly reachable");
}

void DhtNode::follow(net::AutonatClient& autonat) {
  autonat.on_change([weak = weak_from_this()](net::Reachability r) {
    if (auto n = weak.lock(); n && r != net::Reachability::unknown)
      n->set_reachable(r == net::Reachability::public_);
  });
}

DhtNode::~DhtNode() = default;

std::vector<net::Multiaddr> DhtNode::announced() const {
  if (cfg_.dht.client_mode) return {};
  std::vector<net::Multiaddr> out;
  for (const auto& a : cfg_.announce.empty() ? host_->announce_addresses() : cfg_.announce)
    out.push_back(a.without_peer_id());
  return out;
}

awaitable<result<void>> DhtNode::start(std::vector<net::Multiaddr> initial_peers) {
  if (started_) co_return make_error(errc::invalid_argument, "dht node already started");
  started_ = true;
  std::vector<Bytes> addrs;
  for (const auto& a : announced()) addrs.push_back(a.to_bytes());
  core_.set_addresses(std::move(addrs));
  // Relay reservations and AutoNAT change what the host announces: so do our DHT records.
  host_->on_addresses_changed([weak = weak_from_this()] {
    if (auto self = weak.lock()) self->refresh_addresses();
  });
  if (!configured_client_) {  // serves even while set_reachable(false) holds
    net::RpcServerOptions so;
    so.max_message_size = cfg_.dht.limits.max_message_bytes;
    so.max_duration = 30s;  // answering is immediate; this only bounds slow readers
    server_ = std::make_unique<net::RpcServer>(*host_, so);
    std::weak_ptr<DhtNode> weak = weak_from_this();
    server_->add_unary<BytesValue, BytesValue>(
        kDhtProtocol, [weak](const net::RpcContext& ctx, BytesValue req) {
          return serve_entry(weak, ctx.remote(), std::move(*req.mutable_value()));
        });
    if (cfg_.serve_channels)
      host_->set_stream_handler(kDhtChannelProtocol,
                                [weak](net::ByteStreamPtr s, net::PeerId from) {
                                  return serve_channel(weak, std::move(s), std::move(from));
                                });
  }
  auto self = shared_from_this();
  scope_.spawn([self]() { return self->timer_loop(); });
  if (cfg_.warm_connections > 0) scope_.spawn(warm_loop(self));
  if (cfg_.use_channels) scope_.spawn([self]() { return self->channel_sweeper(); });
  dht_log().info("dht node {} started ({} mode)", peer().short_string(),
                 cfg_.dht.client_mode ? "client" : "server");
  if (initial_peers.empty()) co_return success();
  co_return co_await bootstrap(std::move(initial_peers));
}

awaitable<void> DhtNode::stop() {
  if (stopping_) co_return;
  stopping_ = true;
  server_.reset();  // unregisters the protocol: new calls are refused
  if (!configured_client_ && cfg_.serve_channels) host_->remove_stream_handler(kDhtChannelProtocol);
  close_channels();
  timer_.cancel();
  for (const auto& p : warm_kept_) host_->keep_alive(p, false);
  warm_kept_.clear();
  auto waiters = std::move(waiters_);
  waiters_.clear();
  for (auto& [id, w] : waiters) {
    OpResult r;
    r.id = OpId{id};
    r.status = make_error(errc::cancelled, "dht node stopped");
    w->result = std::move(r);
    w->done.set();
  }
  auto closed = co_await scope_.close(cfg_.stop_timeout);
  if (!closed)
    dht_log().warn("dht node {} stop: {}", peer().short_string(), closed.error().message());
}

void DhtNode::pump() {
  if (stopping_) return;
  if (core_.admissions_waiting() > 0) update_admission();
  // Results first: a finished get's caller is woken before the requests its end queued (a
  // cache store along the path) are encoded and written on this thread.
  while (auto r = core_.poll_result()) {
    auto it = waiters_.find(static_cast<std::uint64_t>(r->id));
    if (it == waiters_.end()) continue;  // the caller gave up
    it->second->result = std::move(*r);
    it->second->done.set();
    waiters_.erase(it);
  }
  while (auto out = core_.poll_request()) {
    if (channel_send(*out)) continue;
    ++channel_stats_.rpc_sent;
    auto self = shared_from_this();
    scope_.spawn(
        [self, o = std::move(*out)]() mutable { return self->send_request(std::move(o)); });
  }
  if (core_.next_wakeup() < timer_.expiry()) timer_.expires_at(core_.next_wakeup());
}

awaitable<void> DhtNode::timer_loop() {
  while (!stopping_) {
    timer_.expires_at(core_.next_wakeup());
    (void)co_await timer_.async_wait(use_nothrow);  // aborted = re-armed earlier, or stop
    if (stopping_) break;
    core_.tick(now());
    pump();
  }
}

std::shared_ptr<DhtNode::Waiter> DhtNode::add_waiter(OpId id) {
  auto w = std::make_shared<Waiter>(host_->get_executor());
  waiters_[static_cast<std::uint64_t>(id)] = w;
  return w;
}

awaitable<OpResult> DhtNode::wait_op(OpId id, std::shared_ptr<Waiter> w) {
  const TimePoint t0 = Clock::now();
  pump();
  // The core finishes every operation by its deadline; this bound is only a safety net.
  auto waited =
      co_await with_timeout(w->done.wait(), cfg_.dht.operation_timeout + 5s, "dht operation");
  if (w->result) {
    if (dht_log().should_log(spdlog::level::debug)) {
      const auto& st = w->result->stats;
      dht_log().debug(
          "dht op {} done in {} us: {} requests, {} answers, {} failures, {} hops, {}",
          static_cast<std::uint64_t>(id),
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count(),
          st.requests, st.responses, st.failures, st.hops,
          w->result->status ? "ok" : w->result->status.error().message());
    }
    co_return std::move(*w->result);
  }
  waiters_.erase(static_cast<std::uint64_t>(id));
  OpResult r;
  r.id = id;
  r.status =
      waited ? make_error(errc::internal, "dht operation ended without a result") : waited.error();
  co_return r;
}

awaitable<void> DhtNode::send_request(OutgoingRequest out) {
  std::vector<net::Multiaddr> addrs;
  for (const auto& b : out.to.addrs)
    if (auto a = net::Multiaddr::from_bytes(b)) addrs.push_back(std::move(a).value());
  if (!addrs.empty()) host_->add_addresses(out.to.peer, addrs);
  BytesValue req;
  const Bytes encoded = encode(out.request);
  req.set_value(encoded.data(), encoded.size());
  net::CallOptions opts;
  opts.max_message_size = cfg_.dht.limits.max_message_bytes;
  const auto left = out.deadline - Clock::now();
  opts.timeout = left > 10ms ? left : Duration(10ms);
  auto resp = co_await client_.unary<BytesValue, BytesValue>(out.to.peer, kDhtProtocol, req, opts);
  if (stopping_) co_return;
  if (!resp) {
    core_.on_failure(out.id, resp.error(), now());
  } else if (auto ok = accept_response(core_, out.id, as_bytes(resp.value().value()), now()); !ok) {
    ++bad_messages_;
    dht_log().warn("dht: bad {} response from {}: {}", describe(out.request),
                   out.to.peer.short_string(), ok.error().message());
  }
  pump();
}

awaitable<result<BytesValue>> DhtNode::serve_entry(std::weak_ptr<DhtNode> weak, net::PeerId from,
                                                   std::string request) {
  auto self = weak.lock();
  if (!self || self->stopping_) co_return make_error(errc::unavailable, "dht node stopping");
  ST_CO_TRY(auto resp, self->serve(from, as_bytes(request)));
  BytesValue out;
  out.set_value(resp.data(), resp.size());
  co_return out;
}

result<Bytes> DhtNode::serve(const net::PeerId& from, BytesView request) {
  auto resp = answer_request(core_, from, request, now());
  if (!resp) {
    ++bad_messages_;
    if (core_.warn_allowed(from, Clock::now()))
      dht_log().warn("dht: bad request from {} (stream closed): {}", from.short_string(),
                     resp.error().message());
    return resp.error();
  }
  pump();
  return resp;
}

}  // namespace starling::dht
