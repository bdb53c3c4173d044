// PortMapper (portmap.hpp): finds a NAT-PMP or UPnP IGD gateway, keeps a mapping for each TCP
// listening port renewed, announces the mapped addresses and removes the mappings on stop.
#include "starling/net/portmap.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "starling/core/log.hpp"
#include "starling/net/interfaces.hpp"

namespace starling::net {

namespace {
constexpr const char* kSource = "portmap";
double secs(Duration d) {
  return std::chrono::duration<double>(d).count();
}
}  // namespace

result<std::optional<PortMapConfig>> port_map_mode(std::string_view mode) {
  if (mode == "off") return std::optional<PortMapConfig>{};
  PortMapConfig c;
  if (mode == "pcp") {
    c.natpmp = c.upnp = false;
  } else if (mode == "natpmp") {
    c.pcp = c.upnp = false;
  } else if (mode == "upnp") {
    c.pcp = c.natpmp = false;
  } else if (mode != "auto") {
    return make_error(
        errc::invalid_argument,
        fmt::format("port mapping '{}': expected off, auto, pcp, natpmp or upnp", mode));
  }
  return std::optional<PortMapConfig>(c);
}

std::vector<std::uint16_t> mappable_ports(const std::vector<Multiaddr>& listen) {
  std::vector<std::uint16_t> out;
  for (const auto& a : listen) {
    if (a.is_circuit()) continue;
    auto r = a.to_tcp_endpoint();
    if (!r) continue;
    const auto& ep = r.value();
    if (!ep.address().is_v4() || ep.address().is_loopback() || ep.port() == 0) continue;
    out.push_back(ep.port());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

TimePoint renew_time(TimePoint now, Duration granted, Duration recheck) {
  if (granted <= Duration::zero()) return now + recheck;
  return now + std::max<Duration>(granted / 2, 1s);
}

std::optional<Multiaddr> mapped_address(const PortMapping& m, bool allow_private) {
  if (m.external_port == 0 || m.external_ip.is_unspecified()) return std::nullopt;
  const asio::ip::address ip(m.external_ip);
  if (!allow_private && !is_public_ip(ip)) return std::nullopt;
  return Multiaddr::from_tcp_endpoint({ip, m.external_port});
}

bool router_restarted(const RouterEpoch& before, const RouterEpoch& now) {
  const double elapsed = std::chrono::duration<double>(now.at - before.at).count();
  const double expected = static_cast<double>(before.seconds) + std::max(0.0, elapsed) * 7 / 8;
  return static_cast<double>(now.seconds) + 2 < expected;
}

PortMapper::PortMapper(std::shared_ptr<Host> host, PortMapConfig cfg, BackendFactory backends)
    : host_(std::move(host)),
      cfg_(std::move(cfg)),
      factory_(std::move(backends)),
      scope_(host_->get_executor()),
      changed_(host_->get_executor()) {}

std::shared_ptr<PortMapper> PortMapper::start(std::shared_ptr<Host> host, PortMapConfig cfg,
                                              BackendFactory backends) {
  if (!backends) {
    backends = [ex = host->get_executor(), cfg] {
      std::vector<std::unique_ptr<PortMapBackend>> out;
      if (cfg.pcp) out.push_back(make_pcp_backend(ex));
      if (cfg.natpmp) out.push_back(make_natpmp_backend(ex));
      if (cfg.upnp) out.push_back(make_upnp_backend(ex, cfg.description));
      return out;
    };
  }
  std::shared_ptr<PortMapper> m(
      new PortMapper(std::move(host), std::move(cfg), std::move(backends)));
  m->scope_.spawn([m]() -> awaitable<void> { co_await m->loop(); });
  return m;
}

awaitable<result<void>> PortMapper::wait_mapped(Duration timeout) {
  auto self = shared_from_this();
  const auto deadline = Clock::now() + timeout;
  while (mappings_.empty()) {
    const auto now = Clock::now();
    if (now >= deadline) co_return make_error(errc::timeout, "no port mapping yet");
    (void)co_await with_timeout(changed_.wait(), deadline - now, "port mapping");
    changed_.reset();
  }
  co_return success();
}

void PortMapper::publish() {
  std::vector<Multiaddr> addrs;
  for (const auto& m : mappings_) {
    auto a = mapped_address(m, cfg_.allow_private);
    if (a && std::find(addrs.begin(), addrs.end(), *a) == addrs.end()) addrs.push_back(*a);
  }
  host_->set_extra_addresses(kSource, std::move(addrs));
  changed_.set();
}

awaitable<bool> PortMapper::find_gateway() {
  auto tries = factory_();
  std::string why;
  for (auto& b : tries) {
    auto ext = co_await b->discover(cfg_.discover_timeout);
    if (ext) {
      const bool known = !ext.value().is_unspecified();  // PCP learns it from a mapping
      logger("net")->info("portmap: {} gateway {} (external address {})", b->name(), b->gateway(),
                          known ? ext.value().to_string() : "told with the first mapping");
      if (known && !cfg_.allow_private && !is_public_ip(asio::ip::address(ext.value())))
        logger("net")->warn(
            "portmap: the router's external address {} is not public (a NAT behind a NAT?): "
            "mapped ports will not be announced",
            ext.value().to_string());
      backend_ = std::move(b);
      co_return true;
    }
    if (ext.error() == errc::cancelled) co_return false;
    why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", b->name(), ext.error().message());
  }
  logger("net")->info("portmap: no gateway offers port mapping ({}); next try in {:.0f} s", why,
                      secs(cfg_.retry_interval));
  co_return false;
}

awaitable<bool> PortMapper::refresh(const std::vector<std::uint16_t>& ports) {
  const auto now = Clock::now();
  if (now >= retry_refused_at_) refused_.clear();
  // Mappings of ports no longer listened on are removed.
  for (auto it = mappings_.begin(); it != mappings_.end();) {
    if (std::find(ports.begin(), ports.end(), it->internal_port) != ports.end()) {
      ++it;
      continue;
    }
    (void)co_await backend_->unmap(*it, cfg_.request_timeout);
    it = mappings_.erase(it);
  }
  for (auto port : ports) {
    if (std::find(refused_.begin(), refused_.end(), port) != refused_.end()) continue;
    auto cur = std::find_if(mappings_.begin(), mappings_.end(),
                            [&](const PortMapping& m) { return m.internal_port == port; });
    if (cur != mappings_.end() && Clock::now() < cur->renew_at) continue;
    auto r = co_await backend_->map(port, cfg_.lifetime, cfg_.request_timeout);
    if (r) {
      auto m = r.value();
      const auto granted_at = Clock::now();
      m.renew_at = renew_time(granted_at, m.lifetime, cfg_.retry_interval);
      m.expires = granted_at + m.lifetime;
      const bool changed = cur == mappings_.end() || cur->external_port != m.external_port ||
                           cur->external_ip != m.external_ip;
      logger("net")->info("portmap: {} {} TCP {}:{} -> local port {} for {:.0f} s",
                          backend_->name(), changed ? "mapped" : "renewed",
                          m.external_ip.to_string(), m.external_port, port, secs(m.lifetime));
      if (cur == mappings_.end()) {
        mappings_.push_back(m);
        ++stats_.mapped;
      } else {
        *cur = m;
        ++stats_.renewed;
      }
      continue;
    }
    if (r.error() == errc::cancelled) co_return true;
    if (r.error() == errc::unsupported) {  // the router said no
      ++stats_.refused;
      logger("net")->warn("portmap: the router ({} at {}) refused to map TCP port {}: {}",
                          backend_->name(), backend_->gateway(), port, r.error().message());
      if (cur != mappings_.end()) mappings_.erase(cur);
      refused_.push_back(port);
      retry_refused_at_ = Clock::now() + cfg_.retry_interval;
      continue;
    }
    ++stats_.failed;
    logger("net")->info("portmap: {} request for port {} failed: {}", backend_->name(), port,
                        r.error().message());
    // A mapping that has not expired yet stays announced; the gateway is looked for again.
    co_return false;
  }
  co_return true;
}

awaitable<void> PortMapper::check_epoch() {
  if (!backend_ || mappings_.empty() || cfg_.epoch_check_interval <= Duration::zero()) co_return;
  const auto before = backend_->epoch();
  if (!before || Clock::now() < epoch_check_at_) co_return;
  epoch_check_at_ = Clock::now() + cfg_.epoch_check_interval;
  (void)co_await backend_->discover(cfg_.request_timeout);
  const auto now = backend_->epoch();
  if (!now || !router_restarted(*before, *now)) co_return;
  ++stats_.router_restarts;
  logger("net")->info(
      "portmap: the router restarted (epoch {} s, {} s before): requesting the mappings again",
      now->seconds, before->seconds);
  for (auto& m : mappings_) m.renew_at = Clock::now();
}

awaitable<void> PortMapper::loop() {
  auto self = shared_from_this();
  for (;;) {
    bool ok = false;
    const auto ports = mappable_ports(host_->listen_addresses());
    if (ports.empty() && mappings_.empty()) {
      // Loopback only (tests, demos) or not listening: no router is asked anything.
      if (stats_.idle++ == 0)
        logger("net")->debug("portmap: no IPv4 port listening beyond loopback: nothing to map");
      changed_.set();
      if (!co_await sleep_for(cfg_.retry_interval)) co_return;
      continue;
    }
    co_await check_epoch();
    if (backend_ || co_await find_gateway()) ok = co_await refresh(ports);
    // A mapping the router has not renewed is gone once its lifetime is over.
    const auto now = Clock::now();
    std::erase_if(mappings_, [&](const PortMapping& m) {
      return m.lifetime > Duration::zero() && now >= m.expires;
    });
    publish();
    TimePoint next = now + cfg_.retry_interval;
    if (ok) {
      for (const auto& m : mappings_) next = std::min(next, m.renew_at);
      if (!refused_.empty()) next = std::min(next, retry_refused_at_);
      if (!mappings_.empty() && backend_ && backend_->epoch() &&
          cfg_.epoch_check_interval > Duration::zero()) {
        if (epoch_check_at_ <= now) epoch_check_at_ = now + cfg_.epoch_check_interval;
        next = std::min(next, epoch_check_at_);
      }
    } else {
      backend_.reset();  // look for the gateway again; sooner while a mapping still holds
      for (const auto& m : mappings_)
        next = std::min({next, now + 30s, m.lifetime > Duration::zero() ? m.expires : next});
    }
    auto r = co_await sleep_for(std::max<Duration>(next - Clock::now(), 50ms));
    if (!r) co_return;  // cancelled: stop()
  }
}

awaitable<void> PortMapper::stop() {
  auto self = shared_from_this();
  (void)co_await scope_.close(2s);
  if (backend_ && !mappings_.empty()) {
    auto remove_all = [&]() -> awaitable<result<void>> {
      for (const auto& m : mappings_) {
        auto r = co_await backend_->unmap(m, cfg_.request_timeout);
        if (r) {
          ++stats_.removed;
          logger("net")->info("portmap: removed the mapping of TCP port {}", m.external_port);
        } else {
          logger("net")->info("portmap: removing the mapping of TCP port {}: {}", m.external_port,
                              r.error().message());
        }
      }
      co_return success();
    };
    (void)co_await with_timeout(remove_all(), cfg_.stop_timeout, "removing port mappings");
  }
  mappings_.clear();
  host_->set_extra_addresses(kSource, {});
}

}  // namespace starling::net
