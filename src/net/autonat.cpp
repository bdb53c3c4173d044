// AutoNAT v1: the confidence state machine, message parsing and the server (dial-back).
#include "starling/net/autonat.hpp"

#include <algorithm>

#include "starling/core/log.hpp"
#include "starling/net/interfaces.hpp"
#include "starling/pb/autonat.pb.h"

namespace starling::net {

const char* reachability_name(Reachability r) {
  switch (r) {
    case Reachability::public_:
      return "public";
    case Reachability::private_:
      return "private";
    default:
      return "unknown";
  }
}

bool AutonatCore::record(bool reachable) {
  const auto seen = reachable ? Reachability::public_ : Reachability::private_;
  if (seen == status_) {
    confidence_ = std::min(confidence_ + 1, max_);
    return false;
  }
  if (status_ != Reachability::unknown && confidence_ > 0) {
    --confidence_;
    return false;
  }
  status_ = seen;
  confidence_ = 0;
  return true;
}

result<AutonatDial> parse_autonat_dial(BytesView msg) {
  pb::AutonatMessage m;
  if (msg.size() > kMaxAutonatMessage ||
      !m.ParseFromArray(msg.data(), static_cast<int>(msg.size())))
    return make_error(errc::invalid_argument, "autonat: malformed message");
  if (m.type() != pb::AutonatMessage::DIAL || !m.has_dial() || !m.dial().has_peer())
    return make_error(errc::invalid_argument, "autonat: not a DIAL request");
  AutonatDial d;
  ST_TRY(d.peer, PeerId::from_bytes(as_bytes(m.dial().peer().id())));
  for (const auto& a : m.dial().peer().addrs()) {
    auto ma = Multiaddr::from_bytes(as_bytes(a));
    if (ma) d.addrs.push_back(std::move(ma).value());
  }
  return d;
}

result<AutonatAnswer> parse_autonat_answer(BytesView msg) {
  pb::AutonatMessage m;
  if (msg.size() > kMaxAutonatMessage ||
      !m.ParseFromArray(msg.data(), static_cast<int>(msg.size())))
    return make_error(errc::invalid_argument, "autonat: malformed message");
  if (m.type() != pb::AutonatMessage::DIAL_RESPONSE || !m.has_dialresponse())
    return make_error(errc::invalid_argument, "autonat: not a DIAL_RESPONSE");
  AutonatAnswer a;
  a.status = static_cast<int>(m.dialresponse().status());
  a.text = m.dialresponse().statustext().substr(0, 256);
  if (m.dialresponse().has_addr()) {
    auto ma = Multiaddr::from_bytes(as_bytes(m.dialresponse().addr()));
    if (ma) a.addr = std::move(ma).value();
  }
  return a;
}

AutonatServer::AutonatServer(std::shared_ptr<Host> host, AutonatServerConfig cfg)
    : host_(std::move(host)), cfg_(cfg) {}

std::shared_ptr<AutonatServer> AutonatServer::start(std::shared_ptr<Host> host,
                                                    AutonatServerConfig cfg) {
  std::shared_ptr<AutonatServer> s(new AutonatServer(host, cfg));
  std::weak_ptr<AutonatServer> weak = s;
  host->set_stream_handler(kAutonatProtocol, [weak](ByteStreamPtr st, PeerId p) {
    auto self = weak.lock();
    return self ? self->serve(std::move(st), std::move(p))
                : []() -> awaitable<void> { co_return; }();
  });
  return s;
}

void AutonatServer::stop() {
  host_->remove_stream_handler(kAutonatProtocol);
}

bool AutonatServer::admit(const PeerId& remote, TimePoint now) {
  while (!recent_.empty() && now - recent_.front().first > cfg_.window) recent_.pop_front();
  if (recent_.size() >= cfg_.max_total) return false;
  auto mine = std::count_if(recent_.begin(), recent_.end(),
                            [&](const auto& e) { return e.second == remote; });
  if (static_cast<std::size_t>(mine) >= cfg_.max_per_peer) return false;
  recent_.emplace_back(now, remote);
  return true;
}

awaitable<AutonatAnswer> AutonatServer::handle(const Bytes& msg, const PeerId& remote,
                                               const std::optional<ConnectionInfo>& conn) {
  auto req = parse_autonat_dial(msg);
  if (!req || req.value().peer != remote) {
    ++stats_.bad_requests;
    logger("net")->info("autonat: bad request from {}: {}", remote.short_string(),
                        req ? "peer id is not the requester's" : req.error().message());
    co_return AutonatAnswer{200, "bad request", std::nullopt};
  }
  if (!conn || conn->relayed) {
    ++stats_.refused;
    co_return AutonatAnswer{101, "no dial-back over a relayed connection", std::nullopt};
  }
  auto observed = multiaddr_ip(conn->remote_addr);
  std::vector<Multiaddr> dial;
  for (const auto& a : req.value().addrs) {
    if (dial.size() >= cfg_.max_dials) break;
    auto ip = multiaddr_ip(a);
    auto ep = a.to_tcp_endpoint();
    // Only the requester's observed IP: never a third party (amplification).
    if (!ip || !ep || !observed || *ip != *observed) continue;
    if (!cfg_.allow_private && !is_public_ip(*ip)) continue;
    auto plain = a.without_peer_id();
    if (std::find(dial.begin(), dial.end(), plain) == dial.end()) dial.push_back(plain);
  }
  if (dial.empty()) {
    ++stats_.refused;
    co_return AutonatAnswer{101, "no address at the observed IP to dial", std::nullopt};
  }
  if (!admit(remote, Clock::now())) {
    ++stats_.refused;
    logger("net")->debug("autonat: rate limit, request from {} refused", remote.short_string());
    co_return AutonatAnswer{101, "rate limited", std::nullopt};
  }
  auto deadline = Clock::now() + cfg_.dial_timeout;
  std::string errors;
  for (const auto& a : dial) {
    auto now = Clock::now();
    if (now >= deadline) break;
    auto r = co_await host_->dial_probe(a, remote, deadline - now);
    if (r) {
      ++stats_.dialed_ok;
      co_return AutonatAnswer{0, "OK", a};
    }
    errors += (errors.empty() ? "" : "; ") + r.error().message();
  }
  ++stats_.dial_errors;
  co_return AutonatAnswer{100, "dial failed", std::nullopt};
}

awaitable<void> AutonatServer::serve(ByteStreamPtr s, PeerId remote) {
  auto self = shared_from_this();
  ++stats_.requests;
  auto conn = host_->stream_connection(s.get());
  BufferedReader reader(*s);
  auto msg = co_await with_timeout(reader.read_length_prefixed(kMaxAutonatMessage),
                                   cfg_.read_timeout, "autonat request");
  if (!msg) {
    ++stats_.bad_requests;
    logger("net")->info("autonat: request from {} closed: {}", remote.short_string(),
                        msg.error().message());
    s->reset();
    co_return;
  }
  auto ans = co_await handle(msg.value(), remote, conn);
  pb::AutonatMessage out;
  out.set_type(pb::AutonatMessage::DIAL_RESPONSE);
  auto* r = out.mutable_dialresponse();
  r->set_status(static_cast<pb::AutonatMessage::ResponseStatus>(ans.status));
  r->set_statustext(ans.text);
  if (ans.addr) {
    auto b = ans.addr->to_bytes();
    r->set_addr(b.data(), b.size());
  }
  Bytes bytes(out.ByteSizeLong());
  out.SerializeToArray(bytes.data(), static_cast<int>(bytes.size()));
  if (co_await write_length_prefixed(*s, bytes)) (void)co_await s->close_write();
  if (ans.status == 200) s->reset();
}

}  // namespace starling::net
