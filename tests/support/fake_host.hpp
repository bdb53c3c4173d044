// Test double for the StreamHost seam: an in-process network of hosts on one io_context.
// open_stream() makes a real loopback socket pair (test::tcp_pair) and runs the target host's
// handler for the protocol on the other end, inside the target's task scope. It reports an
// unknown protocol (errc::unsupported, like multistream-select "na"), an unknown or dead peer
// (errc::unavailable) and honours timeouts and cancellation. Tests can make a host
// unresponsive (opens to it hang until their timeout) or kill it (all its streams are reset
// and its handlers cancelled, like a crashed process).
//
// Threading rule: everything runs on the one io_context given to FakeNetwork.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "starling/core/async.hpp"
#include "starling/net/stream_host.hpp"
#include "support/tcp_pair.hpp"

namespace starling::test {

// A deterministic, well-formed peer id: identity multihash of a libp2p-protobuf Ed25519 key
// (0x00 0x24 | 08 01 12 20 | 32 key bytes), so it prints as "12D3KooW...".
inline net::PeerId make_peer_id(std::uint32_t n) {
  Bytes mh{0x00, 0x24, 0x08, 0x01, 0x12, 0x20};
  for (int i = 0; i < 32; ++i)
    mh.push_back(static_cast<std::uint8_t>((n >> (8 * (i % 4))) ^ (0x5b + 37 * i)));
  return net::PeerId::from_bytes(mh).value();
}

class FakeNetwork;

class FakeHost final : public net::StreamHost {
 public:
  FakeHost(FakeNetwork& network, net::PeerId id);
  ~FakeHost() override = default;

  awaitable<result<net::ByteStreamPtr>> open_stream(const net::PeerId& peer, std::string protocol,
                                                    Duration timeout) override;
  void set_stream_handler(std::string protocol, net::StreamHandler handler) override {
    handlers_[std::move(protocol)] = std::make_shared<net::StreamHandler>(std::move(handler));
  }
  void remove_stream_handler(const std::string& protocol) override { handlers_.erase(protocol); }
  const net::PeerId& local_peer() const override { return id_; }
  asio::any_io_executor get_executor() override;

  // ---- test controls ----
  // Streams opened TO this host hang until the opener's timeout (never negotiated).
  void set_unresponsive(bool v) { unresponsive_ = v; }
  // The host dies: every stream it has is reset, its handlers are cancelled, and it can no
  // longer be reached or open streams.
  void kill() {
    alive_ = false;
    for (auto& w : streams_)
      if (auto s = w.lock()) s->reset();
    streams_.clear();
    scope_.reset();  // cancels the running handlers (does not wait)
  }
  bool alive() const noexcept { return alive_; }
  // Inbound handlers still running.
  std::size_t handlers_running() const noexcept { return scope_ ? scope_->active() : 0; }
  // Streams opened from this host so far.
  std::size_t streams_opened() const noexcept { return opened_; }
  // Cancels running handlers and waits for them (bounded).
  awaitable<result<void>> stop(Duration timeout = 5s) {
    if (!scope_) co_return success();
    co_return co_await scope_->close(timeout);
  }

 private:
  static awaitable<void> run_handler(std::shared_ptr<net::StreamHandler> h, net::ByteStreamPtr s,
                                     net::PeerId from) {
    co_await (*h)(std::move(s), std::move(from));
  }
  void track(const net::ByteStreamPtr& s) {
    std::erase_if(streams_, [](const auto& w) { return w.expired(); });
    streams_.push_back(s);
  }

  FakeNetwork* network_;
  net::PeerId id_;
  std::map<std::string, std::shared_ptr<net::StreamHandler>> handlers_;
  std::unique_ptr<TaskScope> scope_;
  std::vector<std::weak_ptr<net::ByteStream>> streams_;
  std::size_t opened_ = 0;
  bool alive_ = true;
  bool unresponsive_ = false;
};

class FakeNetwork {
 public:
  explicit FakeNetwork(asio::io_context& io) : io_(&io) {}
  asio::io_context& io() noexcept { return *io_; }

  FakeHost& add_host() {
    hosts_.push_back(std::make_unique<FakeHost>(*this, make_peer_id(next_id_++)));
    return *hosts_.back();
  }
  FakeHost* find(const net::PeerId& id) {
    for (auto& h : hosts_)
      if (h->local_peer() == id) return h.get();
    return nullptr;
  }

 private:
  asio::io_context* io_;
  std::vector<std::unique_ptr<FakeHost>> hosts_;
  std::uint32_t next_id_ = 1;
};

inline FakeHost::FakeHost(FakeNetwork& network, net::PeerId id)
    : network_(&network),
      id_(std::move(id)),
      scope_(std::make_unique<TaskScope>(network.io().get_executor())) {}

inline asio::any_io_executor FakeHost::get_executor() {
  return network_->io().get_executor();
}

inline awaitable<result<net::ByteStreamPtr>> FakeHost::open_stream(const net::PeerId& peer,
                                                                   std::string protocol,
                                                                   Duration timeout) {
  std::string what = "open stream to " + peer.short_string() + " for " + protocol;
  if (!alive_) co_return make_error(errc::cancelled, what + ": local host is dead");
  FakeHost* target = network_->find(peer);
  if (!target || !target->alive_) co_return make_error(errc::unavailable, what + ": no route");
  if (target->unresponsive_) {
    auto slept = co_await sleep_for(timeout);  // cancellable
    if (!slept) co_return make_error(errc::cancelled, what);
    co_return make_error(errc::timeout, what + ": timed out");
  }
  auto it = target->handlers_.find(protocol);
  if (it == target->handlers_.end())
    co_return make_error(errc::unsupported, what + ": protocol not supported (na)");
  std::shared_ptr<net::TcpStream> local, remote;
  std::string failure;
  try {
    std::tie(local, remote) = tcp_pair(network_->io());
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!local) co_return make_error(errc::io, what + ": " + failure);
  ++opened_;
  track(local);
  target->track(remote);
  target->scope_->spawn(run_handler(it->second, remote, id_));
  co_return net::ByteStreamPtr(local);
}

}  // namespace starling::test
