// DCUtR: HolePunch wire format and the I/O-free per-connection state machine (dcutr.hpp).
#include "starling/net/dcutr.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "dcutr.pb.h"
#include "starling/net/interfaces.hpp"

namespace starling::net {

Bytes encode_hole_punch(const HolePunchMsg& m) {
  pb::HolePunch p;
  p.set_type(static_cast<pb::HolePunch::Type>(m.type));
  for (const auto& a : m.addrs) {
    auto b = a.to_bytes();
    p.add_obsaddrs(b.data(), b.size());
  }
  Bytes out(p.ByteSizeLong());
  p.SerializeToArray(out.data(), static_cast<int>(out.size()));
  return out;
}

Bytes frame_hole_punch(const HolePunchMsg& m) {
  auto body = encode_hole_punch(m);
  Bytes out;
  append_uvarint(out, body.size());
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

result<HolePunchMsg> parse_hole_punch(BytesView body) {
  if (body.size() > kMaxHolePunchMessage)
    return make_error(errc::invalid_argument, "dcutr: message too large");
  pb::HolePunch p;
  // proto2 `required type`: a missing or unknown type fails the parse.
  if (!p.ParseFromArray(body.data(), static_cast<int>(body.size())) || !p.has_type())
    return make_error(errc::invalid_argument, "dcutr: malformed HolePunch");
  HolePunchMsg m;
  m.type = static_cast<HolePunchMsg::Type>(p.type());
  for (const auto& a : p.obsaddrs()) {
    if (m.addrs.size() >= kMaxHolePunchAddrs) break;
    if (auto ma = Multiaddr::from_bytes(as_bytes(a))) m.addrs.push_back(std::move(ma).value());
  }
  return m;
}

bool dcutr_dialable(const Multiaddr& addr, bool allow_private) {
  if (addr.is_circuit()) return false;
  auto ep = addr.without_peer_id().to_tcp_endpoint();
  if (!ep || ep.value().port() == 0) return false;
  const auto ip = ep.value().address();
  if (ip.is_unspecified() || ip.is_multicast()) return false;
  return allow_private || is_public_ip(ip);
}

std::vector<Multiaddr> dcutr_filter(const std::vector<Multiaddr>& addrs, bool allow_private) {
  std::vector<Multiaddr> out;
  for (const auto& a : addrs)
    if (dcutr_dialable(a, allow_private) && std::find(out.begin(), out.end(), a) == out.end())
      out.push_back(a);
  return out;
}

std::string_view dcutr_state_name(DcutrMachine::State s) {
  switch (s) {
    case DcutrMachine::State::idle:
      return "idle";
    case DcutrMachine::State::await_connect:
      return "await_connect";
    case DcutrMachine::State::await_sync:
      return "await_sync";
    case DcutrMachine::State::dialing:
      return "dialing";
    case DcutrMachine::State::succeeded:
      return "succeeded";
    case DcutrMachine::State::failed:
      return "failed";
  }
  return "?";
}

DcutrMachine::DcutrMachine(DcutrRole role, std::vector<Multiaddr> our_addrs, DcutrConfig cfg)
    : role_(role), ours_(std::move(our_addrs)), cfg_(cfg) {
  if (cfg_.max_attempts < 1) cfg_.max_attempts = 1;
}

std::optional<TimePoint> DcutrMachine::deadline() const {
  if (done() || wait_until_ == TimePoint{}) return std::nullopt;
  return wait_until_;
}

std::vector<DcutrAction> DcutrMachine::fail(std::string reason) {
  state_ = State::failed;
  wait_until_ = {};
  DcutrAction a;
  a.kind = DcutrAction::Kind::failed;
  a.reason = std::move(reason);
  return {std::move(a)};
}

std::vector<DcutrAction> DcutrMachine::send_connect(TimePoint now) {
  ++attempts_;
  state_ = State::await_connect;
  sent_at_ = now;
  wait_until_ = now + cfg_.message_timeout;
  DcutrAction a;
  a.kind = DcutrAction::Kind::send;
  a.message.type = HolePunchMsg::Type::connect;
  a.message.addrs = ours_;
  return {std::move(a)};
}

std::vector<DcutrAction> DcutrMachine::start(TimePoint now) {
  if (state_ != State::idle || attempts_ != 0) return fail("dcutr: start() called twice");
  if (role_ == DcutrRole::responder) {
    wait_until_ = now + cfg_.message_timeout;  // the peer's CONNECT
    return {};
  }
  if (ours_.empty()) return fail("dcutr: no address of ours to offer");
  return send_connect(now);
}

std::vector<DcutrAction> DcutrMachine::attempt_failed(std::string reason, TimePoint now) {
  if (attempts_ >= cfg_.max_attempts)
    return fail(fmt::format("{} (attempt {} of {})", reason, attempts_, cfg_.max_attempts));
  if (role_ == DcutrRole::initiator) return send_connect(now);
  state_ = State::idle;  // the initiator retries with a fresh CONNECT
  wait_until_ = now + cfg_.message_timeout;
  return {};
}

std::vector<DcutrAction> DcutrMachine::on_message(const HolePunchMsg& m, TimePoint now) {
  if (done()) return {};
  const bool is_connect = m.type == HolePunchMsg::Type::connect;
  if (role_ == DcutrRole::initiator) {
    if (state_ != State::await_connect || !is_connect)
      return fail(fmt::format("dcutr: unexpected {} in state {}", is_connect ? "CONNECT" : "SYNC",
                              dcutr_state_name(state_)));
    auto peer = dcutr_filter(m.addrs, cfg_.allow_private);
    if (peer.empty()) return fail("dcutr: the peer offered no dialable address");
    rtt_ = now - sent_at_;
    state_ = State::dialing;
    DcutrAction sync;
    sync.kind = DcutrAction::Kind::send;
    sync.message.type = HolePunchMsg::Type::sync;
    DcutrAction dial;
    dial.kind = DcutrAction::Kind::dial;
    dial.at = now + *rtt_ / 2;
    dial.addrs = std::move(peer);
    wait_until_ = dial.at + cfg_.dial_timeout;
    return {std::move(sync), std::move(dial)};
  }
  // Responder. A CONNECT while dialing: the initiator gave up on that attempt first.
  if (is_connect && (state_ == State::idle || state_ == State::dialing)) {
    if (attempts_ >= cfg_.max_attempts) return fail("dcutr: too many CONNECTs");
    ++attempts_;
    if (dcutr_filter(m.addrs, cfg_.allow_private).empty())
      return fail("dcutr: the peer offered no dialable address");
    if (ours_.empty()) return fail("dcutr: no address of ours to offer");
    peer_addrs_ = dcutr_filter(m.addrs, cfg_.allow_private);
    state_ = State::await_sync;
    wait_until_ = now + cfg_.message_timeout;
    DcutrAction a;
    a.kind = DcutrAction::Kind::send;
    a.message.type = HolePunchMsg::Type::connect;
    a.message.addrs = ours_;
    return {std::move(a)};
  }
  if (!is_connect && state_ == State::await_sync) {
    state_ = State::dialing;
    wait_until_ = now + cfg_.dial_timeout;
    DcutrAction dial;
    dial.kind = DcutrAction::Kind::dial;
    dial.at = now;
    dial.addrs = peer_addrs_;
    return {std::move(dial)};
  }
  return fail(fmt::format("dcutr: unexpected {} in state {}", is_connect ? "CONNECT" : "SYNC",
                          dcutr_state_name(state_)));
}

std::vector<DcutrAction> DcutrMachine::on_dial_result(bool ok, TimePoint now) {
  if (done()) return {};
  if (ok) {
    // A direct connection can also arrive through the listener before our own dial starts.
    state_ = State::succeeded;
    wait_until_ = {};
    DcutrAction a;
    a.kind = DcutrAction::Kind::succeeded;
    return {std::move(a)};
  }
  if (state_ != State::dialing) return {};
  return attempt_failed("dcutr: hole punch failed", now);
}

std::vector<DcutrAction> DcutrMachine::on_timeout(TimePoint now) {
  if (done() || wait_until_ == TimePoint{} || now < wait_until_) return {};
  switch (state_) {
    case State::dialing:
      return attempt_failed("dcutr: hole punch timed out", now);
    case State::await_connect:
      return fail("dcutr: no CONNECT from the peer in time");
    case State::await_sync:
      return fail("dcutr: no SYNC from the peer in time");
    default:
      return fail("dcutr: the peer did not start an attempt in time");
  }
}

}  // namespace starling::net
