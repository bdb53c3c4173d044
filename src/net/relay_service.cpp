// Circuit relay v2 service: the hop protocol (RESERVE, CONNECT) with the limits of
// RelayServiceConfig, and the byte pipe between the two halves of a circuit.
#include <ctime>

#include <fmt/format.h>

#include "relay_internal.hpp"
#include "starling/core/log.hpp"
#include "starling/net/interfaces.hpp"

namespace starling::net {

namespace {
std::uint64_t unix_now() {
  return static_cast<std::uint64_t>(std::time(nullptr));
}
std::string ip_of(const Multiaddr& a) {
  auto ip = multiaddr_ip(a);
  return ip ? ip->to_string() : a.to_string();
}
}  // namespace

RelayService::RelayService(std::shared_ptr<Host> host, RelayServiceConfig cfg)
    : host_(std::move(host)), cfg_(std::move(cfg)), scope_(host_->get_executor()) {}

std::shared_ptr<RelayService> RelayService::start(std::shared_ptr<Host> host,
                                                  RelayServiceConfig cfg) {
  std::shared_ptr<RelayService> r(new RelayService(host, std::move(cfg)));
  std::weak_ptr<RelayService> weak = r;
  host->set_stream_handler(kRelayHopProtocol, [weak](ByteStreamPtr s, PeerId p) {
    auto self = weak.lock();
    return self ? self->serve_hop(std::move(s), std::move(p))
                : []() -> awaitable<void> { co_return; }();
  });
  // A reservation lives only as long as the holder's connection to us.
  host->on_peer_disconnected([weak](const PeerId& p) {
    if (auto self = weak.lock()) self->reservations_.erase(p);
  });
  return r;
}

awaitable<void> RelayService::stop() {
  auto self = shared_from_this();
  stopped_ = true;
  host_->remove_stream_handler(kRelayHopProtocol);
  (void)co_await scope_.close(2s);
  reservations_.clear();
}

awaitable<void> RelayService::serve_hop(ByteStreamPtr s, PeerId remote) {
  auto self = shared_from_this();
  auto conn = host_->stream_connection(s.get());
  auto got = co_await read_relay_message(*s, cfg_.message_timeout);
  if (!got) {
    logger("net")->debug("relay: hop request from {}: {}", remote.short_string(),
                         got.error().message());
    s->reset();
    co_return;
  }
  auto msg = parse_hop(got.value().first);
  if (!msg) {
    ++stats_.malformed;
    logger("net")->info("relay: malformed hop message from {}, stream closed",
                        remote.short_string());
    (void)co_await write_hop_status(*s, RelayStatus::malformed_message);
    s->reset();
    co_return;
  }
  if (!conn || conn->relayed) {  // never over a relayed connection (spec)
    ++stats_.reservations_refused;
    (void)co_await write_hop_status(*s, RelayStatus::permission_denied);
    (void)co_await s->close_write();
    co_return;
  }
  switch (msg.value().type()) {
    case pb::HopMessage::RESERVE:
      co_await reserve(s, remote, *conn);
      break;
    case pb::HopMessage::CONNECT:
      if (!msg.value().has_peer()) {
        ++stats_.malformed;
        (void)co_await write_hop_status(*s, RelayStatus::malformed_message);
        s->reset();
        co_return;
      }
      co_await connect(s, std::move(got.value().second), remote, as_bytes(msg.value().peer().id()));
      break;
    default:
      logger("net")->info("relay: unexpected hop message type from {}, stream closed",
                          remote.short_string());
      (void)co_await write_hop_status(*s, RelayStatus::unexpected_message);
      s->reset();
  }
}

awaitable<void> RelayService::reserve(ByteStreamPtr s, const PeerId& remote,
                                      const ConnectionInfo& conn) {
  auto now = Clock::now();
  for (auto it = reservations_.begin(); it != reservations_.end();)
    it = it->second.expire <= now ? reservations_.erase(it) : std::next(it);
  const auto ip = ip_of(conn.remote_addr);
  std::size_t same_ip = 0;
  for (const auto& [p, r] : reservations_) same_ip += (p != remote && r.ip == ip);
  const bool refresh = reservations_.count(remote) > 0;
  if (!refresh &&
      (reservations_.size() >= cfg_.max_reservations || same_ip >= cfg_.max_reservations_per_ip)) {
    ++stats_.reservations_refused;
    logger("net")->debug("relay: reservation from {} refused ({} held, {} from {})",
                         remote.short_string(), reservations_.size(), same_ip, ip);
    (void)co_await write_hop_status(*s, RelayStatus::reservation_refused);
    (void)co_await s->close_write();
    co_return;
  }
  const auto ttl_s = std::chrono::duration_cast<std::chrono::seconds>(cfg_.reservation_ttl);
  const std::uint64_t expire = unix_now() + static_cast<std::uint64_t>(ttl_s.count());
  reservations_[remote] = Reservation{now + cfg_.reservation_ttl, ip};
  ++stats_.reservations_accepted;
  pb::HopMessage m;
  m.set_type(pb::HopMessage::STATUS);
  m.set_status(pb::OK);
  auto* rsv = m.mutable_reservation();
  rsv->set_expire(expire);
  for (const auto& a : cfg_.announce.empty() ? host_->announce_addresses() : cfg_.announce) {
    if (a.is_circuit()) continue;
    auto b = a.with_peer_id(host_->local_peer()).to_bytes();
    rsv->add_addrs(b.data(), b.size());
  }
  auto voucher = seal_voucher(host_->key(), {host_->local_peer(), remote, expire});
  rsv->set_voucher(voucher.data(), voucher.size());
  set_limit(*m.mutable_limit());
  auto bytes = encode_message(m);
  if (co_await write_length_prefixed(*s, bytes)) (void)co_await s->close_write();
  logger("net")->debug("relay: reservation for {} until {}", remote.short_string(), expire);
}

void RelayService::set_limit(pb::RelayLimit& lim) const {
  // Seconds on the wire (the spec's unit); an absent field means no limit.
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(cfg_.circuit_duration);
  if (secs.count() > 0) lim.set_duration(static_cast<std::uint32_t>(secs.count()));
  if (cfg_.circuit_data > 0) lim.set_data(cfg_.circuit_data);
}

void RelayService::count_circuit(const PeerId& p, int delta) {
  auto& n = circuits_[p];
  n = static_cast<std::size_t>(static_cast<long>(n) + delta);
  if (n == 0) circuits_.erase(p);
}

awaitable<void> RelayService::connect(ByteStreamPtr s, Bytes rest, const PeerId& remote,
                                      BytesView target_bytes) {
  auto target = PeerId::from_bytes(target_bytes);
  if (!target) {
    ++stats_.malformed;
    (void)co_await write_hop_status(*s, RelayStatus::malformed_message);
    s->reset();
    co_return;
  }
  auto refuse = [&](RelayStatus st) -> awaitable<void> {
    ++stats_.circuits_refused;
    logger("net")->debug("relay: circuit {} -> {} refused: {}", remote.short_string(),
                         target.value().short_string(), relay_status_name(static_cast<int>(st)));
    (void)co_await write_hop_status(*s, st);
    (void)co_await s->close_write();
  };
  auto it = reservations_.find(target.value());
  if (stopped_ || it == reservations_.end() || it->second.expire <= Clock::now() ||
      !host_->is_connected(target.value())) {
    co_await refuse(RelayStatus::no_reservation);
    co_return;
  }
  auto count = [&](const PeerId& p) {
    auto c = circuits_.find(p);
    return c == circuits_.end() ? std::size_t{0} : c->second;
  };
  if (circuits_total_ >= cfg_.max_circuits || count(remote) >= cfg_.max_circuits_per_peer ||
      count(target.value()) >= cfg_.max_circuits_per_peer) {
    co_await refuse(RelayStatus::resource_limit_exceeded);
    co_return;
  }
  // Counted from here, so concurrent CONNECTs cannot overshoot the limits.
  ++circuits_total_;
  count_circuit(remote, 1);
  count_circuit(target.value(), 1);
  struct Uncount {
    RelayService& r;
    PeerId a, b;
    ~Uncount() {
      --r.circuits_total_;
      r.count_circuit(a, -1);
      r.count_circuit(b, -1);
    }
  } uncount{*this, remote, target.value()};
  auto stop_side = [&]() -> awaitable<result<ByteStreamPtr>> {
    ST_CO_TRY(auto st, co_await host_->open_stream(target.value(), kRelayStopProtocol,
                                                   cfg_.connect_timeout));
    pb::StopMessage m;
    m.set_type(pb::StopMessage::CONNECT);
    m.mutable_peer()->set_id(remote.bytes().data(), remote.bytes().size());
    set_limit(*m.mutable_limit());
    auto bytes = encode_message(m);
    ST_CO_TRY(co_await write_length_prefixed(*st, bytes));
    auto got = co_await read_relay_message(*st, cfg_.connect_timeout);
    if (!got) {
      st->reset();
      co_return got.error();
    }
    auto ans = parse_stop(got.value().first);
    if (!ans || ans.value().type() != pb::StopMessage::STATUS) {
      st->reset();
      co_return make_error(errc::protocol_violation, "malformed stop answer");
    }
    if (ans.value().status() != pb::OK) {
      st->reset();
      co_return make_error(
          errc::unavailable,
          std::string("target answered ") + std::string(relay_status_name(ans.value().status())));
    }
    co_return with_prefix(st, std::move(got.value().second));
  };
  auto b_side = co_await with_timeout(stop_side(), cfg_.connect_timeout, "relay stop CONNECT");
  if (!b_side) {
    ++stats_.circuits_failed;
    logger("net")->debug("relay: circuit {} -> {} failed: {}", remote.short_string(),
                         target.value().short_string(), b_side.error().message());
    (void)co_await write_hop_status(*s, RelayStatus::connection_failed);
    (void)co_await s->close_write();
    co_return;
  }
  pb::HopMessage ok;
  ok.set_type(pb::HopMessage::STATUS);
  ok.set_status(pb::OK);
  set_limit(*ok.mutable_limit());
  auto ok_bytes = encode_message(ok);
  if (!co_await write_length_prefixed(*s, ok_bytes)) {
    b_side.value()->reset();
    co_return;
  }
  ++stats_.circuits_opened;
  auto a_side = with_prefix(s, std::move(rest));
  auto b = b_side.value();
  // Both directions run until closed, reset, or a limit: then both streams are reset.
  auto limited = std::make_shared<bool>(false);
  TaskScope both(host_->get_executor());
  both.spawn(pipe(a_side, b, limited));
  both.spawn(pipe(b, a_side, limited));
  // No duration limit (0): a year stands for "until either side closes".
  auto done = co_await both.join(cfg_.circuit_duration > Duration::zero()
                                     ? cfg_.circuit_duration
                                     : std::chrono::duration_cast<Duration>(8760h));
  if (!done || *limited) {
    ++stats_.circuits_limited;
    logger("net")->debug("relay: circuit {} -> {} reached its limit, reset", remote.short_string(),
                         target.value().short_string());
    a_side->reset();
    b->reset();
  }
  (void)co_await both.close(1s);
}

awaitable<void> RelayService::pipe(ByteStreamPtr from, ByteStreamPtr to,
                                   std::shared_ptr<bool> limited) {
  Bytes buf(cfg_.buffer_size);
  std::uint64_t moved = 0;
  for (;;) {
    auto n = co_await from->read_some(buf);
    if (!n) {
      if (n.error() == errc::closed)
        (void)co_await to->close_write();
      else
        to->reset();
      co_return;
    }
    if (cfg_.circuit_data > 0 && moved + n.value() > cfg_.circuit_data) {
      *limited = true;
      from->reset();
      to->reset();
      co_return;
    }
    moved += n.value();
    stats_.bytes_relayed += n.value();
    if (!co_await to->write(BytesView(buf.data(), n.value()))) {
      from->reset();
      co_return;
    }
  }
}

}  // namespace starling::net
