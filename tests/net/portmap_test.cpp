// Port mapping (portmap.hpp): the pure helpers, and the PortMapper's lifecycle against a
// scripted router (no network: a fake backend): map each listening port, announce the mapped
// address, renew before expiry, handle a refusal and a router that stops answering, remove
// the mappings on stop. The real protocols run against miniupnpd in netlab (netlab_portmap).
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <set>

#include "starling/net/portmap.hpp"
#include "support/tcp_pair.hpp"

using namespace starling;
using namespace starling::net;

namespace {

Multiaddr ma(const char* s) {
  return Multiaddr::parse(s).value();
}

TEST(PortMapHelpers, MappablePorts) {
  EXPECT_EQ(mappable_ports({ma("/ip4/0.0.0.0/tcp/4001"), ma("/ip4/127.0.0.1/tcp/4002"),
                            ma("/ip4/192.168.1.5/tcp/4003"), ma("/ip6/::/tcp/4004"),
                            ma("/ip4/0.0.0.0/tcp/4001")}),
            (std::vector<std::uint16_t>{4001, 4003}));
  EXPECT_TRUE(mappable_ports({ma("/ip4/127.0.0.1/tcp/1")}).empty());
}

TEST(PortMapHelpers, Modes) {
  EXPECT_FALSE(port_map_mode("off").value());
  auto a = port_map_mode("auto").value();
  EXPECT_TRUE(a && a->natpmp && a->upnp);
  auto n = port_map_mode("natpmp").value();
  EXPECT_TRUE(n && n->natpmp && !n->upnp);
  auto u = port_map_mode("upnp").value();
  EXPECT_TRUE(u && !u->natpmp && u->upnp);
  EXPECT_FALSE(port_map_mode("yes"));
}

TEST(PortMapHelpers, RenewAtHalfTheLifetime) {
  const TimePoint t0{};
  EXPECT_EQ(renew_time(t0, 3600s, 5min), t0 + 1800s);
  EXPECT_EQ(renew_time(t0, 1s, 5min), t0 + 1s);    // at least a second
  EXPECT_EQ(renew_time(t0, 0s, 5min), t0 + 5min);  // permanent: checked again
}

TEST(PortMapHelpers, RouterRestartFromEpoch) {
  const TimePoint t0{};
  const RouterEpoch before{1000, t0};
  EXPECT_FALSE(router_restarted(before, {1060, t0 + 60s}));  // advanced with the clock
  EXPECT_FALSE(router_restarted(before, {1000, t0 + 1s}));   // within the 2 s slack
  EXPECT_FALSE(router_restarted(before, {1051, t0 + 60s}));  // 7/8 of 60 s is enough
  EXPECT_TRUE(router_restarted(before, {1049, t0 + 60s}));   // too slow: restarted since
  EXPECT_TRUE(router_restarted(before, {5, t0 + 10s}));      // went back
}

TEST(PortMapHelpers, AnnouncesOnlyPublicExternalAddresses) {
  PortMapping m;
  m.external_port = 4001;
  m.external_ip = asio::ip::make_address_v4("11.0.0.7");
  EXPECT_EQ(mapped_address(m, false), ma("/ip4/11.0.0.7/tcp/4001"));
  m.external_ip = asio::ip::make_address_v4("10.0.0.7");  // double NAT
  EXPECT_FALSE(mapped_address(m, false));
  EXPECT_EQ(mapped_address(m, true), ma("/ip4/10.0.0.7/tcp/4001"));
  m.external_port = 0;
  EXPECT_FALSE(mapped_address(m, true));
}

// A router the test scripts; shared with the backend the mapper owns.
struct FakeRouter {
  asio::ip::address_v4 ext = asio::ip::make_address_v4("11.0.0.7");
  Duration grant = 1s;
  std::set<std::uint16_t> refuse;
  bool answer = true;  // false: every request fails with a timeout
  int discovers = 0, maps = 0;
  std::set<std::uint16_t> mapped;      // what the router holds now
  std::optional<std::uint32_t> epoch;  // NAT-PMP's seconds since the router started (if any)
};

class FakeBackend final : public PortMapBackend {
 public:
  explicit FakeBackend(std::shared_ptr<FakeRouter> r) : r_(std::move(r)) {}
  const char* name() const override { return "fake"; }
  std::string gateway() const override { return "10.0.0.1"; }
  std::optional<RouterEpoch> epoch() const override { return epoch_; }
  awaitable<result<asio::ip::address_v4>> discover(Duration) override {
    ++r_->discovers;
    if (!r_->answer) co_return make_error(errc::unavailable, "no gateway");
    answered();
    co_return r_->ext;
  }
  awaitable<result<PortMapping>> map(std::uint16_t port, Duration, Duration) override {
    if (!r_->answer) co_return make_error(errc::timeout, "no answer");
    answered();
    if (r_->refuse.count(port)) co_return make_error(errc::unsupported, "606 not authorized");
    ++r_->maps;
    r_->mapped.insert(port);
    PortMapping m;
    m.internal_port = port;
    m.external_port = port;
    m.external_ip = r_->ext;
    m.lifetime = r_->grant;
    co_return m;
  }
  awaitable<result<void>> unmap(const PortMapping& m, Duration) override {
    if (!r_->answer) co_return make_error(errc::timeout, "no answer");
    r_->mapped.erase(m.internal_port);
    co_return success();
  }

 private:
  void answered() {
    if (r_->epoch) epoch_ = RouterEpoch{*r_->epoch, Clock::now()};
  }
  std::shared_ptr<FakeRouter> r_;
  std::optional<RouterEpoch> epoch_;
};

PortMapper::BackendFactory fake(std::shared_ptr<FakeRouter> r) {
  return [r] {
    std::vector<std::unique_ptr<PortMapBackend>> v;
    v.push_back(std::make_unique<FakeBackend>(r));
    return v;
  };
}

// Polls `cond` every 5 ms until it holds or `limit` passes.
template <class F>
awaitable<bool> eventually(F cond, Duration limit = 10s) {
  const auto deadline = Clock::now() + limit;
  while (!cond()) {
    if (Clock::now() >= deadline) co_return false;
    (void)co_await sleep_for(5ms);
  }
  co_return true;
}

bool announces(Host& h, const Multiaddr& a) {
  auto all = h.announce_addresses();
  return std::find(all.begin(), all.end(), a.with_peer_id(h.local_peer())) != all.end();
}

struct PortMapFixture {
  asio::io_context io;
  std::shared_ptr<FakeRouter> router = std::make_shared<FakeRouter>();
  std::shared_ptr<Host> host;
  PortMapConfig cfg;
  explicit PortMapFixture(std::string listen = "/ip4/0.0.0.0/tcp/0") {
    HostConfig hc;
    hc.listen = {std::move(listen)};
    host = Host::create(io.get_executor(), crypto::KeyPair::generate(), hc);
    cfg.retry_interval = 300ms;
  }
  std::uint16_t port() const { return mappable_ports(host->listen_addresses()).at(0); }
  Multiaddr mapped() const { return ma(("/ip4/11.0.0.7/tcp/" + std::to_string(port())).c_str()); }
};

}  // namespace

TEST(PortMapper, MapsAnnouncesRenewsAndRemovesOnStop) {
  PortMapFixture f;
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await f.host->start());
    auto pm = PortMapper::start(f.host, f.cfg, fake(f.router));
    CO_ASSERT_OK(co_await pm->wait_mapped(5s));
    EXPECT_EQ(pm->protocol(), "fake");
    EXPECT_TRUE(f.router->mapped.count(f.port()));
    EXPECT_TRUE(announces(*f.host, f.mapped()));
    // Granted 1 s: renewed at half of it, again and again, without a gap in the announcement.
    EXPECT_TRUE(co_await eventually([&] { return pm->stats().renewed >= 3; }));
    EXPECT_EQ(pm->stats().mapped, 1u);
    EXPECT_TRUE(announces(*f.host, f.mapped()));
    co_await pm->stop();
    EXPECT_TRUE(f.router->mapped.empty());  // removed from the router
    EXPECT_EQ(pm->stats().removed, 1u);
    EXPECT_FALSE(announces(*f.host, f.mapped()));
    co_await f.host->stop();
  });
}

TEST(PortMapper, RefusedPortIsNotAnnouncedAndRetriedLater) {
  PortMapFixture f;
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await f.host->start());
    f.router->refuse.insert(f.port());
    auto pm = PortMapper::start(f.host, f.cfg, fake(f.router));
    EXPECT_TRUE(co_await eventually([&] { return pm->stats().refused >= 2; }));  // retried
    EXPECT_TRUE(pm->mappings().empty());
    EXPECT_FALSE(announces(*f.host, f.mapped()));
    f.router->refuse.clear();  // the user changed the router's rules
    CO_ASSERT_OK(co_await pm->wait_mapped(5s));
    EXPECT_TRUE(announces(*f.host, f.mapped()));
    co_await pm->stop();
    co_await f.host->stop();
  });
}

TEST(PortMapper, PrivateExternalAddressIsNotAnnounced) {
  PortMapFixture f;
  f.router->ext = asio::ip::make_address_v4("100.64.3.4");  // carrier-grade NAT
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await f.host->start());
    auto pm = PortMapper::start(f.host, f.cfg, fake(f.router));
    CO_ASSERT_OK(co_await pm->wait_mapped(5s));
    for (const auto& a : f.host->announce_addresses())
      EXPECT_EQ(a.to_string().find("100.64.3.4"), std::string::npos) << a.to_string();
    co_await pm->stop();
    co_await f.host->stop();
  });
}

TEST(PortMapper, SilentRouterLosesTheMappingAtExpiryAndIsFoundAgain) {
  PortMapFixture f;
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await f.host->start());
    auto pm = PortMapper::start(f.host, f.cfg, fake(f.router));
    CO_ASSERT_OK(co_await pm->wait_mapped(5s));
    f.router->answer = false;
    // The renewal fails; once the granted second is over the address is withdrawn.
    EXPECT_TRUE(co_await eventually([&] { return !announces(*f.host, f.mapped()); }));
    EXPECT_TRUE(pm->mappings().empty());
    EXPECT_GE(pm->stats().failed, 1u);
    const int before = f.router->discovers;
    f.router->answer = true;
    EXPECT_TRUE(co_await eventually([&] { return announces(*f.host, f.mapped()); }));
    EXPECT_GT(f.router->discovers, before);  // the gateway was looked for again
    co_await pm->stop();
    co_await f.host->stop();
  });
}

// Port mapping is on by default in `starling train|node`: a host listening on loopback only
// (tests, demos) must never send the gateway anything.
TEST(PortMapper, LoopbackOnlyHostAsksNoGateway) {
  PortMapFixture f("/ip4/127.0.0.1/tcp/0");
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await f.host->start());
    auto pm = PortMapper::start(f.host, f.cfg, fake(f.router));
    EXPECT_TRUE(co_await eventually([&] { return pm->stats().idle >= 2; }));  // 2 passes
    EXPECT_EQ(f.router->discovers, 0);
    EXPECT_EQ(f.router->maps, 0);
    EXPECT_TRUE(pm->mappings().empty());
    EXPECT_EQ(pm->protocol(), "");
    co_await pm->stop();
    co_await f.host->stop();
  });
}

// NAT-PMP (RFC 6886 §3.6): a router that restarted lost its mappings and says so with an epoch
// that went back; the mapper reads the epoch every epoch_check_interval and maps again at
// once, long before the renewal at half the lease.
TEST(PortMapper, RouterRestartIsNoticedFromTheEpochAndMappedAgain) {
  PortMapFixture f;
  f.router->grant = 3600s;  // the next renewal is half an hour away
  f.router->epoch = 1000;
  f.cfg.epoch_check_interval = 100ms;
  test::run_with_deadline(f.io, [&]() -> awaitable<void> {
    CO_ASSERT_OK(co_await f.host->start());
    auto pm = PortMapper::start(f.host, f.cfg, fake(f.router));
    CO_ASSERT_OK(co_await pm->wait_mapped(5s));
    const int discovers = f.router->discovers;
    EXPECT_TRUE(co_await eventually([&] { return f.router->discovers >= discovers + 2; }));
    EXPECT_EQ(pm->stats().router_restarts, 0u);  // a steady epoch is no restart
    EXPECT_EQ(f.router->maps, 1);
    f.router->mapped.clear();  // the router restarts: mappings gone, epoch from 0
    f.router->epoch = 0;
    EXPECT_TRUE(co_await eventually([&] { return f.router->mapped.count(f.port()) > 0; }, 5s));
    EXPECT_EQ(pm->stats().router_restarts, 1u);
    EXPECT_EQ(f.router->maps, 2);
    EXPECT_TRUE(announces(*f.host, f.mapped()));
    co_await pm->stop();
    co_await f.host->stop();
  });
}
