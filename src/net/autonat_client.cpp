// AutoNAT v1 client: asks identified peers that serve /libp2p/autonat/1.0.0 to dial it back,
// folds the answers into a reachability with a confidence, re-checks periodically and when
// the announced addresses change, and announces the address a confident public check
// confirmed.
#include <algorithm>

#include "starling/core/log.hpp"
#include "starling/net/autonat.hpp"
#include "starling/pb/autonat.pb.h"

namespace starling::net {

AutonatClient::AutonatClient(std::shared_ptr<Host> host, AutonatClientConfig cfg)
    : host_(std::move(host)),
      cfg_(cfg),
      core_(cfg.max_confidence),
      scope_(host_->get_executor()),
      wake_(host_->get_executor()) {}

std::shared_ptr<AutonatClient> AutonatClient::start(std::shared_ptr<Host> host,
                                                    AutonatClientConfig cfg) {
  std::shared_ptr<AutonatClient> c(new AutonatClient(host, cfg));
  std::weak_ptr<AutonatClient> weak = c;
  host->on_peer_identified([weak](const PeerId& p) {
    if (auto self = weak.lock(); self && self->core_.confidence() < self->cfg_.max_confidence)
      self->wake_.pulse();  // a new possible server while we are unsure
  });
  host->on_addresses_changed([weak] {
    if (auto self = weak.lock()) self->wake_.pulse();  // e.g. a port mapping: check it
  });
  c->scope_.spawn([c]() -> awaitable<void> { co_await c->loop(); });
  return c;
}

awaitable<void> AutonatClient::stop() {
  auto self = shared_from_this();
  (void)co_await scope_.close(2s);
  host_->set_extra_addresses("autonat", {});
}

namespace {
// The direct addresses the host announces (what a re-check is about when it changes).
std::vector<Multiaddr> direct_announced(const Host& host) {
  std::vector<Multiaddr> out;
  for (const auto& a : host.announce_addresses())
    if (!a.is_circuit()) out.push_back(a.without_peer_id());
  return out;
}
}  // namespace

std::vector<Multiaddr> AutonatClient::candidates() const {
  std::vector<Multiaddr> out = direct_announced(*host_);
  for (const auto& a : host_->observed_addresses())
    if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  return out;
}

awaitable<result<AutonatAnswer>> AutonatClient::probe(const PeerId& server, Duration timeout) {
  auto self = shared_from_this();
  auto op = [&]() -> awaitable<result<AutonatAnswer>> {
    ST_CO_TRY(auto s, co_await host_->open_stream(server, kAutonatProtocol, timeout));
    pb::AutonatMessage m;
    m.set_type(pb::AutonatMessage::DIAL);
    auto* peer = m.mutable_dial()->mutable_peer();
    auto id = host_->local_peer().bytes();
    peer->set_id(id.data(), id.size());
    for (const auto& a : candidates()) {
      auto b = a.to_bytes();
      peer->add_addrs(b.data(), b.size());
    }
    Bytes bytes(m.ByteSizeLong());
    m.SerializeToArray(bytes.data(), static_cast<int>(bytes.size()));
    ST_CO_TRY(co_await write_length_prefixed(*s, bytes));
    BufferedReader reader(*s);
    ST_CO_TRY(auto msg, co_await reader.read_length_prefixed(kMaxAutonatMessage));
    (void)co_await s->close_write();
    auto ans = parse_autonat_answer(msg);
    if (!ans) {
      s->reset();
      logger("net")->info("autonat: malformed answer from {}, stream closed",
                          server.short_string());
    }
    co_return ans;
  };
  auto r = co_await with_timeout(op(), timeout, "autonat request to " + server.to_string());
  if (!r) co_return r;
  const auto& a = r.value();
  if (a.status == 0 || a.status == 100) {
    if (core_.record(a.status == 0)) {
      logger("net")->info("autonat: reachability {} ({} said {})",
                          reachability_name(core_.status()), server.short_string(),
                          a.status == 0 ? "OK" : "E_DIAL_ERROR");
      for (auto& cb : on_change_) cb(core_.status());
    }
    // A confirmed address the host did not announce yet (an observed mapping) is announced
    // once the status is public; a private status withdraws it.
    if (core_.status() == Reachability::public_ && a.status == 0 && a.addr) {
      auto ann = host_->announce_addresses();
      auto full = a.addr->with_peer_id(host_->local_peer());
      if (std::find(ann.begin(), ann.end(), full) == ann.end())
        host_->set_extra_addresses("autonat", {*a.addr});
    } else if (core_.status() == Reachability::private_) {
      host_->set_extra_addresses("autonat", {});
    }
  }
  co_return r;
}

awaitable<result<void>> AutonatClient::wait_status(Reachability want, Duration timeout) {
  auto self = shared_from_this();
  auto deadline = Clock::now() + timeout;
  while (core_.status() != want) {
    auto now = Clock::now();
    if (now >= deadline) co_return make_error(errc::timeout, "autonat status");
    (void)co_await sleep_for(std::min<Duration>(deadline - now, 20ms));
  }
  co_return success();
}

awaitable<void> AutonatClient::loop() {
  auto self = shared_from_this();
  std::vector<Multiaddr> last = direct_announced(*host_);
  std::map<PeerId, TimePoint> asked;
  for (;;) {
    // Servers: identified, connected directly, speaking AutoNAT, not asked recently.
    std::vector<PeerId> servers;
    auto now = Clock::now();
    for (const auto& c : host_->connections()) {
      if (c.relayed || servers.size() >= cfg_.servers_per_round) continue;
      auto info = host_->peer_info(c.peer);
      if (!info || !info->identified) continue;
      if (std::find(info->protocols.begin(), info->protocols.end(), kAutonatProtocol) ==
          info->protocols.end())
        continue;
      auto it = asked.find(c.peer);
      if (it != asked.end() && now - it->second < cfg_.retry_interval) continue;
      if (std::find(servers.begin(), servers.end(), c.peer) == servers.end())
        servers.push_back(c.peer);
    }
    for (const auto& s : servers) {
      asked[s] = Clock::now();
      auto r = co_await probe(s, cfg_.timeout);
      if (!r && r.error() == errc::cancelled) co_return;
      if (!r)
        logger("net")->debug("autonat: {} did not answer: {}", s.short_string(),
                             r.error().message());
    }
    // Our direct addresses changed (a port mapping, an interface) during the probes or while
    // waiting: what we knew may no longer hold, ask again at once.
    if (auto now_addrs = direct_announced(*host_); now_addrs != last) {
      last = std::move(now_addrs);
      asked.clear();
      continue;
    }
    const auto period = core_.confident() ? cfg_.interval : cfg_.retry_interval;
    auto w = co_await with_timeout(wake_.wait(), period, "autonat wait");
    if (!w && w.error() == errc::cancelled) co_return;
    if (auto now_addrs = direct_announced(*host_); now_addrs != last) {
      last = std::move(now_addrs);
      asked.clear();
    }
  }
}

}  // namespace starling::net
