// Host: the identify protocol (/ipfs/id/1.0.0 and push) and ping.
#include <sodium.h>

#include "host_internal.hpp"
#include "identify.pb.h"
#include "starling/core/log.hpp"
#include "starling/net/multistream.hpp"

namespace starling::net {

namespace {
constexpr std::size_t kMaxIdentifySize = 64 * 1024;
constexpr const char* kProtocolVersion = "ipfs/0.1.0";
}  // namespace

Bytes Host::identify_message(const Multiaddr& observed) const {
  pb::Identify msg;
  msg.set_protocolversion(kProtocolVersion);
  msg.set_agentversion(cfg_.agent_version);
  auto pk = key_.public_key().to_protobuf();
  msg.set_publickey(pk.data(), pk.size());
  for (auto& a : announce_addresses()) {
    auto b = a.without_peer_id().to_bytes();
    msg.add_listenaddrs(b.data(), b.size());
  }
  auto ob = observed.to_bytes();
  msg.set_observedaddr(ob.data(), ob.size());
  for (auto& [p, h] : handlers_) msg.add_protocols(p);
  Bytes out(msg.ByteSizeLong());
  msg.SerializeToArray(out.data(), static_cast<int>(out.size()));
  return out;
}

void Host::apply_identify(const PeerId& peer, BytesView data) {
  pb::Identify msg;
  if (!msg.ParseFromArray(data.data(), static_cast<int>(data.size()))) {
    logger("net")->warn("identify from {}: malformed message", peer.short_string());
    return;
  }
  if (msg.has_publickey()) {
    auto pk = crypto::PublicKey::from_protobuf(BytesView(
        reinterpret_cast<const std::uint8_t*>(msg.publickey().data()), msg.publickey().size()));
    if (!pk || PeerId::from_public_key(pk.value()) != peer) {
      logger("net")->warn("identify from {}: public key does not match the peer id",
                          peer.short_string());
      return;
    }
  }
  auto& info = touch_peer(peer, /*met=*/true);  // identify runs over a connection
  info.protocols.assign(msg.protocols().begin(), msg.protocols().end());
  info.agent_version = msg.agentversion();
  info.protocol_version = msg.protocolversion();
  std::vector<Multiaddr> addrs;
  for (auto& a : msg.listenaddrs()) {
    if (addrs.size() == addr_book_.cap()) break;  // the address book keeps no more
    auto ma = Multiaddr::from_bytes(as_bytes(a));
    if (ma) addrs.push_back(ma.value());
  }
  add_addresses(peer, addrs, AddrSource::peer);
  if (msg.has_observedaddr()) {
    auto ma = Multiaddr::from_bytes(as_bytes(msg.observedaddr()));
    if (ma) info.observed_addr = ma.value();
  }
  info.identified = true;
  for (auto& cb : on_identified_) cb(peer);
  if (auto it = identify_waiters_.find(peer); it != identify_waiters_.end()) {
    it->second->set();
    identify_waiters_.erase(it);
  }
}

awaitable<void> Host::identify_peer(std::shared_ptr<Connection> conn) {
  auto self = shared_from_this();
  auto op = [&]() -> awaitable<result<Bytes>> {
    ST_CO_TRY(auto raw, co_await conn->session->open_stream());
    std::vector<std::string> protos{kIdentifyProtocol};
    ST_CO_TRY(auto neg, co_await multistream_select(raw, protos, cfg_.negotiate_timeout));
    // The responder writes one message (length-prefixed) and closes. Read until close.
    Bytes all;
    std::array<std::uint8_t, 4096> buf;
    for (;;) {
      auto n = co_await neg.stream->read_some(buf);
      if (!n) {
        if (n.error() == errc::closed) break;
        co_return n.error();
      }
      all.insert(all.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n.value()));
      if (all.size() > kMaxIdentifySize + 8)
        co_return make_error(errc::too_large, "identify message too large");
    }
    (void)co_await neg.stream->close_write();
    co_return all;
  };
  auto r = co_await with_timeout(op(), cfg_.negotiate_timeout, "identify");
  if (!r) {
    logger("net")->debug("identify with {} failed: {}", conn->peer.short_string(),
                         r.error().message());
    co_return;
  }
  auto d = decode_uvarint(r.value());
  if (!d || !d.value() || d.value()->value + d.value()->length > r.value().size()) {
    logger("net")->warn("identify from {}: bad length prefix", conn->peer.short_string());
    co_return;
  }
  apply_identify(conn->peer, BytesView(r.value()).subspan(d.value()->length, d.value()->value));
  maybe_start_dcutr(conn);  // B of a relayed connection: try to upgrade it (host_dcutr.cpp)
}

awaitable<void> Host::serve_identify(ByteStreamPtr stream, PeerId remote) {
  Multiaddr observed;
  if (auto c = best_connection(remote)) observed = c->remote_addr;
  auto msg = identify_message(observed);
  if (co_await write_length_prefixed(*stream, msg)) (void)co_await stream->close_write();
}

awaitable<void> Host::serve_identify_push(ByteStreamPtr stream, PeerId remote) {
  BufferedReader reader(*stream);
  auto msg = co_await with_timeout(reader.read_length_prefixed(kMaxIdentifySize),
                                   cfg_.negotiate_timeout, "identify push");
  if (msg) apply_identify(remote, msg.value());
  (void)co_await stream->close_write();
}

awaitable<result<PeerInfo>> Host::wait_identified(const PeerId& peer, Duration timeout) {
  auto self = shared_from_this();
  if (auto it = peers_.find(peer); it != peers_.end() && it->second.info.identified)
    co_return it->second.info;
  auto& ev = identify_waiters_[peer];
  if (!ev) ev = std::make_shared<AsyncEvent>(ex_);
  auto keep = ev;
  ST_CO_TRY(co_await with_timeout(keep->wait(), timeout, "identify " + peer.to_string()));
  auto it = peers_.find(peer);
  if (it == peers_.end() || !it->second.info.identified)
    co_return make_error(errc::cancelled, "host stopped before identify");
  co_return it->second.info;
}

awaitable<result<std::vector<Duration>>> ping(Host& host, const PeerId& peer, int count,
                                              Duration timeout) {
  auto op = [&]() -> awaitable<result<std::vector<Duration>>> {
    ST_CO_TRY(auto s, co_await host.open_stream(peer, kPingProtocol, timeout));
    std::vector<Duration> rtts;
    std::array<std::uint8_t, 32> out, in;
    for (int i = 0; i < count; ++i) {
      randombytes_buf(out.data(), out.size());
      auto t0 = Clock::now();
      ST_CO_TRY(co_await s->write(out));
      ST_CO_TRY(co_await read_exact(*s, in));
      if (in != out) {
        s->reset();
        co_return make_error(errc::protocol_violation, "ping reply does not match");
      }
      rtts.push_back(Clock::now() - t0);
    }
    (void)co_await s->close_write();
    co_return rtts;
  };
  co_return co_await with_timeout(op(), timeout, "ping " + peer.to_string());
}

}  // namespace starling::net
