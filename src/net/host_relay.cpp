// Host: dialing a /p2p-circuit multiaddr through a circuit relay v2 (hop CONNECT), and
// accepting a relayed connection handed over by the relay client's /stop handler. Over the
// relayed stream the usual upgrade runs (multistream, Noise XX, yamux): the dialer is the
// initiator, and the Noise handshake authenticates the far end, not the relay.
#include "host_internal.hpp"
#include "relay_internal.hpp"
#include "starling/core/log.hpp"
#include "starling/net/multistream.hpp"

namespace starling::net {

namespace {
Duration left(TimePoint deadline) {
  auto now = Clock::now();
  return deadline > now ? deadline - now : Duration::zero();
}
}  // namespace

awaitable<result<std::shared_ptr<Host::Connection>>> Host::dial_circuit(
    Multiaddr addr, std::optional<PeerId> expected, TimePoint deadline) {
  auto self = shared_from_this();
  ST_CO_TRY(auto parts, addr.circuit_parts());
  auto& [relay_addr, target] = parts;
  if (!target) target = expected;
  if (!target)
    co_return make_error(errc::invalid_argument,
                         "dial " + addr.to_string() + ": no target peer after /p2p-circuit");
  if (expected && *expected != *target)
    co_return make_error(errc::invalid_argument,
                         "dial " + addr.to_string() + ": the address names another peer");
  auto relay = relay_addr.peer_id();
  if (!relay || *relay == *target || *relay == id_)
    co_return make_error(errc::invalid_argument, "dial " + addr.to_string() + ": bad relay");
  // The relay part may be just /p2p/<relay>: then its known addresses are used.
  std::optional<Multiaddr> first;
  if (relay_addr.components().size() > 1) {
    first = relay_addr;
    add_addresses(*relay, {relay_addr});
  }
  ST_CO_TRY(auto rconn, co_await get_or_dial(*relay, deadline, first));
  if (rconn->relayed)
    co_return make_error(errc::unsupported, "dial " + addr.to_string() +
                                                ": the relay is itself only reachable relayed");
  ST_CO_TRY(auto raw, co_await rconn->session->open_stream());
  auto hop = multistream_select_lazy(raw, kRelayHopProtocol);
  pb::HopMessage req;
  req.set_type(pb::HopMessage::CONNECT);
  req.mutable_peer()->set_id(target->bytes().data(), target->bytes().size());
  auto req_bytes = encode_message(req);
  ST_CO_TRY(co_await write_length_prefixed(*hop, req_bytes));
  auto got = co_await read_relay_message(*hop, left(deadline));
  if (!got) {
    hop->reset();
    co_return got.error().with_context("relay " + relay->short_string() + " hop CONNECT");
  }
  auto msg = parse_hop(got.value().first);
  if (!msg || msg.value().type() != pb::HopMessage::STATUS) {
    hop->reset();
    logger("net")->info("relay {}: malformed hop answer, stream closed", relay->short_string());
    co_return make_error(errc::protocol_violation,
                         "relay " + relay->short_string() + ": malformed hop answer");
  }
  if (msg.value().status() != pb::OK) {
    hop->reset();
    co_return make_error(
        errc::unavailable,
        fmt::format("relay {} refused to connect to {}: {}", relay->short_string(),
                    target->short_string(), relay_status_name(msg.value().status())));
  }
  auto pipe = with_prefix(hop, std::move(got.value().second));
  auto up = co_await upgrade_outbound(pipe, *target, deadline);
  if (!up) {
    pipe->reset();
    co_return up.error().with_context("relayed connection to " + target->short_string());
  }
  auto remote = relay_addr.with_circuit().with_peer_id(*target);
  co_return add_connection(up.value().session, up.value().peer, remote, /*outbound=*/true,
                           /*relayed=*/true);
}

awaitable<result<PeerId>> Host::accept_relayed(ByteStreamPtr stream, Multiaddr remote,
                                               PeerId expected, Duration timeout) {
  auto self = shared_from_this();
  if (stopping_) co_return make_error(errc::cancelled, "host is stopping");
  auto up =
      co_await with_timeout(upgrade_inbound(stream, timeout, expected), timeout, "relayed upgrade");
  if (!up) {
    stream->reset();
    co_return up.error();
  }
  if (up.value().peer != expected) {
    stream->reset();
    co_return make_error(errc::protocol_violation, "relay named " + expected.short_string() +
                                                       " but the peer is " +
                                                       up.value().peer.short_string());
  }
  auto conn = add_connection(up.value().session, up.value().peer, remote, /*outbound=*/false,
                             /*relayed=*/true);
  ++stats_.inbound_connections;
  co_return conn->peer;
}

awaitable<result<PeerId>> Host::dial_punched(Multiaddr addr, PeerId expected, bool as_client,
                                             Duration timeout) {
  auto self = shared_from_this();
  if (stopping_) co_return make_error(errc::cancelled, "host is stopping");
  if (!cfg_.hole_punching)
    co_return make_error(errc::unsupported, "dial_punched: HostConfig::hole_punching is off");
  const TimePoint deadline = Clock::now() + timeout;
  ST_CO_TRY(auto ep, addr.without_peer_id().to_tcp_endpoint());
  std::optional<asio::ip::tcp::endpoint> local;
  for (const auto& l : listen_addrs_)
    if (auto lep = l.to_tcp_endpoint(); lep && lep.value().protocol() == ep.protocol()) {
      local = lep.value();
      break;
    }
  if (!local) co_return make_error(errc::unsupported, "no listener for " + addr.to_string());
  ST_CO_TRY(auto tcp, co_await tcp_connect_from(ep, *local, timeout));
  ByteStreamPtr raw = tcp;
  result<Upgraded> up = make_error(errc::internal, "punched upgrade");
  if (as_client) {
    std::optional<PeerId> want = expected;
    up = co_await upgrade_outbound(raw, want, deadline);
  } else {
    up = co_await with_timeout(upgrade_inbound(raw, timeout, expected), timeout, "punched upgrade");
  }
  if (!up) {
    raw->reset();
    co_return up.error().with_context("hole punch to " + addr.to_string());
  }
  if (up.value().peer != expected) {
    raw->reset();
    co_return make_error(errc::protocol_violation,
                         "punched connection reached " + up.value().peer.short_string());
  }
  auto conn = add_connection(up.value().session, up.value().peer, endpoint_addr(ep), as_client,
                             /*relayed=*/false);
  ++(as_client ? stats_.outbound_connections : stats_.inbound_connections);
  co_return conn->peer;
}

}  // namespace starling::net
