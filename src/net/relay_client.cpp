// Circuit relay v2 client: keeps reservations with relays (RESERVE on the hop protocol,
// refreshed before they expire, the relay connection kept alive), announces the
// /p2p-circuit addresses they give, and accepts relayed connections on the stop protocol.
#include <ctime>

#include <fmt/format.h>

#include "relay_internal.hpp"
#include "starling/core/log.hpp"

namespace starling::net {

namespace {
std::uint64_t unix_now() {
  return static_cast<std::uint64_t>(std::time(nullptr));
}
}  // namespace

RelayClient::RelayClient(std::shared_ptr<Host> host, RelayClientConfig cfg)
    : host_(std::move(host)),
      cfg_(std::move(cfg)),
      scope_(host_->get_executor()),
      changed_(host_->get_executor()) {}

std::shared_ptr<RelayClient> RelayClient::start(std::shared_ptr<Host> host, RelayClientConfig cfg) {
  std::shared_ptr<RelayClient> c(new RelayClient(host, std::move(cfg)));
  for (const auto& a : c->cfg_.relays) c->add_relay(a);
  std::weak_ptr<RelayClient> weak = c;
  host->set_stream_handler(kRelayStopProtocol, [weak](ByteStreamPtr s, PeerId p) {
    auto self = weak.lock();
    return self ? self->serve_stop(std::move(s), std::move(p))
                : []() -> awaitable<void> { co_return; }();
  });
  host->on_peer_disconnected([weak](const PeerId& p) {
    auto self = weak.lock();
    if (!self || self->held_.erase(p) == 0) return;
    logger("net")->info("relay {}: connection lost, reservation dropped", p.short_string());
    self->publish();
    self->changed_.pulse();
  });
  c->scope_.spawn([c]() -> awaitable<void> { co_await c->maintain(); });
  if (c->cfg_.probe_interval > Duration::zero())
    c->scope_.spawn([c]() -> awaitable<void> { co_await c->probe_relays(); });
  return c;
}

awaitable<void> RelayClient::probe_relays() {
  auto self = shared_from_this();
  for (;;) {
    if (!co_await sleep_for(cfg_.probe_interval)) co_return;
    std::vector<PeerId> relays;
    for (const auto& [r, h] : held_) relays.push_back(r);
    for (const auto& relay : relays) {
      auto r = co_await ping(*host_, relay, 1, cfg_.probe_timeout);
      if (r) continue;
      if (r.error() == errc::cancelled) co_return;
      // Only silence counts: a relay that refuses ping still answers, and a closed connection
      // already dropped the reservation.
      if (r.error() != errc::timeout || !held_.count(relay)) continue;
      ++silent_relays_;
      logger("net")->info(
          "relay {}: no answer to a ping within {} ms ({}): closing the connection",
          relay.short_string(),
          std::chrono::duration_cast<std::chrono::milliseconds>(cfg_.probe_timeout).count(),
          r.error().message());
      // Not asked again before retry_interval (a frozen relay's kernel still completes TCP
      // handshakes: a RESERVE would wait reserve_timeout); another relay is asked now.
      next_try_[relay] = Clock::now() + cfg_.retry_interval;
      // The reservation goes now (closing waits a while for the streams through it).
      held_.erase(relay);
      host_->keep_alive(relay, false);
      publish();
      changed_.pulse();
      host_->disconnect(relay);
    }
  }
}

awaitable<void> RelayClient::stop() {
  auto self = shared_from_this();
  host_->remove_stream_handler(kRelayStopProtocol);
  (void)co_await scope_.close(2s);
  for (const auto& [r, h] : held_) host_->keep_alive(r, false);
  held_.clear();
  host_->set_extra_addresses("relay", {});
}

void RelayClient::add_relay(const Multiaddr& addr) {
  auto id = addr.peer_id();
  if (!id || *id == host_->local_peer()) return;
  if (addr.components().size() > 1) host_->add_addresses(*id, {addr});
  if (std::find(relays_.begin(), relays_.end(), *id) == relays_.end()) relays_.push_back(*id);
  changed_.pulse();
}

std::vector<RelayClient::Held> RelayClient::reservations() const {
  std::vector<Held> out;
  for (const auto& [r, h] : held_) out.push_back(h);
  return out;
}

void RelayClient::publish() {
  std::vector<Multiaddr> addrs;
  for (const auto& r : relays_)
    if (auto it = held_.find(r); it != held_.end())
      addrs.insert(addrs.end(), it->second.addrs.begin(), it->second.addrs.end());
  host_->set_extra_addresses("relay", std::move(addrs), cfg_.announce_first);
}

awaitable<result<RelayClient::Held>> RelayClient::reserve(const PeerId& relay, Duration timeout) {
  auto self = shared_from_this();
  auto op = [&]() -> awaitable<result<Held>> {
    ST_CO_TRY(auto s, co_await host_->open_stream(relay, kRelayHopProtocol, timeout));
    pb::HopMessage req;
    req.set_type(pb::HopMessage::RESERVE);
    auto bytes = encode_message(req);
    ST_CO_TRY(co_await write_length_prefixed(*s, bytes));
    auto got = co_await read_relay_message(*s, timeout);
    if (!got) {
      s->reset();
      co_return got.error();
    }
    auto msg = parse_hop(got.value().first);
    if (!msg || msg.value().type() != pb::HopMessage::STATUS) {
      s->reset();
      logger("net")->info("relay {}: malformed RESERVE answer, stream closed",
                          relay.short_string());
      co_return make_error(errc::protocol_violation, "malformed RESERVE answer");
    }
    (void)co_await s->close_write();
    const auto& m = msg.value();
    if (m.status() != pb::OK)
      co_return make_error(errc::unavailable,
                           fmt::format("reservation refused: {}", relay_status_name(m.status())));
    if (!m.has_reservation() || m.reservation().expire() <= unix_now())
      co_return make_error(errc::protocol_violation, "reservation without a future expiry");
    Held h;
    h.relay = relay;
    h.expire = m.reservation().expire();
    h.granted = h.expire - unix_now();
    for (const auto& a : m.reservation().addrs()) {
      auto ma = Multiaddr::from_bytes(as_bytes(a));
      if (!ma || ma.value().is_circuit() || h.addrs.size() >= kMaxAddrsPerPeer) continue;
      h.addrs.push_back(ma.value().with_peer_id(relay).with_circuit());
    }
    if (h.addrs.empty())  // a relay that announces no address: the one we reached it at
      for (const auto& c : host_->connections())
        if (c.peer == relay && !c.relayed && c.outbound) {
          h.addrs.push_back(c.remote_addr.with_peer_id(relay).with_circuit());
          break;
        }
    if (m.reservation().has_voucher()) {
      auto v = open_voucher(as_bytes(m.reservation().voucher()));
      if (!v || v.value().relay != relay || v.value().peer != host_->local_peer())
        co_return make_error(errc::protocol_violation,
                             "reservation voucher does not verify" +
                                 (v ? std::string() : ": " + v.error().message()));
      h.voucher = v.value();
    }
    if (m.has_limit()) {
      h.limit_duration = m.limit().duration();
      h.limit_data = m.limit().data();
    }
    co_return h;
  };
  auto r = co_await with_timeout(op(), timeout, "reserve with relay " + relay.to_string());
  if (!r) co_return r.error().with_context("relay " + relay.short_string());
  host_->keep_alive(relay, true);  // the reservation lives as long as this connection
  held_[relay] = r.value();
  publish();
  changed_.pulse();
  logger("net")->info("relay {}: reservation until {} ({} addresses)", relay.short_string(),
                      r.value().expire, r.value().addrs.size());
  co_return r;
}

awaitable<result<void>> RelayClient::wait_reservations(std::size_t n, Duration timeout) {
  auto self = shared_from_this();
  auto deadline = Clock::now() + timeout;
  while (held_.size() < n) {
    auto now = Clock::now();
    if (now >= deadline)
      co_return make_error(errc::timeout,
                           fmt::format("{} of {} relay reservations held", held_.size(), n));
    (void)co_await with_timeout(changed_.wait(), std::min<Duration>(deadline - now, 1s),
                                "relay reservations");
  }
  co_return success();
}

awaitable<void> RelayClient::maintain() {
  auto self = shared_from_this();
  for (;;) {
    auto now = Clock::now();
    const auto unix = unix_now();
    Duration next = cfg_.retry_interval;
    // An expired reservation (its refresh failed) is no longer announced.
    bool dropped = false;
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->second.expire > unix) {
        ++it;
        continue;
      }
      logger("net")->info("relay {}: reservation expired", it->first.short_string());
      host_->keep_alive(it->first, false);
      it = held_.erase(it);
      dropped = true;
    }
    if (dropped) publish();
    std::size_t held = held_.size();
    for (const auto& relay : relays_) {
      auto it = held_.find(relay);
      bool due;
      if (it != held_.end()) {
        // Refresh when a quarter of the granted time is left.
        const auto left = it->second.expire > unix ? it->second.expire - unix : 0;
        due = left * 4 <= it->second.granted || left <= 1;
      } else {
        auto t = next_try_.find(relay);
        due = held < cfg_.want_reservations && (t == next_try_.end() || t->second <= now);
      }
      if (!due) continue;
      auto r = co_await reserve(relay, cfg_.reserve_timeout);
      if (r) {
        held = held_.size();
        continue;
      }
      if (r.error() == errc::cancelled) co_return;
      logger("net")->info("{}", r.error().message());
      next_try_[relay] = Clock::now() + cfg_.retry_interval;
    }
    // Wake up for the next refresh (a quarter of the granted time before expiry).
    const auto unix_after = unix_now();
    for (const auto& [relay, h] : held_) {
      const auto left = h.expire > unix_after ? h.expire - unix_after : 0;
      const auto wait = left > h.granted / 4 ? left - h.granted / 4 : 0;
      next = std::min<Duration>(next, std::chrono::seconds(std::max<std::uint64_t>(1, wait)));
    }
    auto w = co_await with_timeout(changed_.wait(), next, "relay maintenance");
    if (!w && w.error() == errc::cancelled) co_return;
  }
}

awaitable<void> RelayClient::serve_stop(ByteStreamPtr s, PeerId relay) {
  auto self = shared_from_this();
  auto got = co_await read_relay_message(*s, cfg_.stop_timeout);
  if (!got) {
    s->reset();
    co_return;
  }
  auto msg = parse_stop(got.value().first);
  if (!msg || msg.value().type() != pb::StopMessage::CONNECT || !msg.value().has_peer()) {
    logger("net")->info("relay {}: malformed stop message, stream closed", relay.short_string());
    (void)co_await write_stop_status(
        *s, msg ? RelayStatus::unexpected_message : RelayStatus::malformed_message);
    s->reset();
    co_return;
  }
  auto peer = PeerId::from_bytes(as_bytes(msg.value().peer().id()));
  if (!peer) {
    (void)co_await write_stop_status(*s, RelayStatus::malformed_message);
    s->reset();
    co_return;
  }
  auto conn = host_->stream_connection(s.get());
  if (!held_.count(relay) || (conn && conn->relayed)) {
    ++refused_stops_;
    logger("net")->info("relay {}: stop CONNECT without a reservation refused",
                        relay.short_string());
    (void)co_await write_stop_status(*s, RelayStatus::permission_denied);
    (void)co_await s->close_write();
    co_return;
  }
  if (!co_await write_stop_status(*s, RelayStatus::ok)) co_return;
  Multiaddr remote = Multiaddr().with_peer_id(relay).with_circuit().with_peer_id(peer.value());
  auto pipe = with_prefix(s, std::move(got.value().second));
  auto r = co_await host_->accept_relayed(pipe, remote, peer.value(), cfg_.stop_timeout);
  if (!r)
    logger("net")->info("relayed connection from {} via {} failed: {}", peer.value().short_string(),
                        relay.short_string(), r.error().message());
}

}  // namespace starling::net
