// Private parts of Host shared by its translation units.
#pragma once

#include "starling/net/host.hpp"
#include "starling/net/tcp.hpp"

namespace starling::net {

struct Host::Connection {
  std::uint64_t id = 0;
  PeerId peer;
  Multiaddr remote_addr;
  bool outbound = false;
  bool relayed = false;
  std::shared_ptr<YamuxSession> session;
  TimePoint last_active;
  bool closed = false;
  bool dcutr_tried = false;  // a DCUtR upgrade of this (relayed, inbound) connection began
};

// An inbound connection still in its handshake (Host::pending_inbound_).
struct Host::PendingInbound {
  std::uint64_t id = 0;
  TimePoint started;
  std::weak_ptr<TcpStream> tcp;
  bool evicted = false;
};

struct Host::PendingDial {
  explicit PendingDial(asio::any_io_executor ex) : done(ex) {}
  AsyncEvent done;
  result<std::shared_ptr<Connection>> outcome = make_error(errc::internal, "dial in progress");
};

// A hole punch in progress towards one peer (host_dcutr.cpp).
struct Host::Punch {
  explicit Punch(asio::any_io_executor ex) : changed(ex) {}
  PeerId peer;
  bool as_client = false;
  int running = 0;     // our dials and accepted connections from the peer still upgrading
  AsyncEvent changed;  // pulsed when one of them ends
};

struct Host::Upgraded {
  std::shared_ptr<YamuxSession> session;
  PeerId peer;
};

inline Multiaddr endpoint_addr(const asio::ip::tcp::endpoint& ep) {
  return Multiaddr::from_tcp_endpoint(ep);
}

}  // namespace starling::net
