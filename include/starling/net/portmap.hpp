// Port mapping through the home router: PCP (RFC 6887, net/pcp.hpp), NAT-PMP (RFC 6886, Debian
// libnatpmp) and UPnP IGD (WANIPConnection AddPortMapping, Debian libminiupnpc). A PortMapper finds
// the gateway, asks it to forward each TCP listening port of the host, renews every mapping when
// half of its granted lifetime has passed, removes them on stop(), and announces the mapped
// external address (Host::set_extra_addresses "portmap") so identify, DHT records and AutoNAT see
// it. Only IPv4 ports listening beyond loopback are mapped (mappable_ports()): a host that listens
// on loopback only never sends the gateway anything. A router that refuses (NAT-PMP "not
// authorized", UPnP 606/718/...) gets a warning with its reason; the mapper asks again after
// `retry_interval`. `auto` tries PCP, then NAT-PMP (a NAT-PMP-only gateway answers PCP with
// "unsupported version"), then UPnP.
//
// Threading rule: as Host (one executor; call from coroutines on it). NAT-PMP runs on the
// executor and so does PCP (non-blocking UDP); libminiupnpc is blocking, so each UPnP call runs on
// a thread of its own that the executor polls with a deadline: a router that stops answering costs
// the mapper a timeout, never a hang (an abandoned call ends with libminiupnpc's socket timeouts
// and only touches its own copy of the gateway's URLs).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <asio/ip/address_v4.hpp>
#include <asio/ip/udp.hpp>

#include "starling/core/async.hpp"
#include "starling/net/host.hpp"

namespace starling::net {

struct PortMapConfig {
  bool pcp = true;                 // tried first (UDP to the default gateway's port 5351)
  bool natpmp = true;              // then NAT-PMP (the same port, the older protocol)
  bool upnp = true;                // then UPnP IGD (SSDP discovery, SOAP over HTTP)
  Duration lifetime = 1h;          // lease asked for; renewed at half of what is granted
  Duration discover_timeout = 4s;  // finding a gateway, per protocol
  Duration request_timeout = 6s;   // one mapping request (NAT-PMP retries included)
  Duration retry_interval = 5min;  // after no gateway answered, a refusal or a failed renewal
  Duration stop_timeout = 3s;      // removing the mappings in stop()
  // PCP and NAT-PMP: while mappings are held, the router's epoch (seconds since it started, in
  // every answer) is read this often (one ANNOUNCE / address request); an epoch that went back
  // means the router restarted and lost its mappings, so they are requested again at once (RFC 6886
  // §3.6) instead of at the next renewal. 0: not watched (renewals still see it).
  Duration epoch_check_interval = 60s;
  // Announce the mapped address even when the router's external address is not public (a
  // NAT behind a NAT cannot be reached through it; labs may want it anyway).
  bool allow_private = false;
  std::string description = "starling";  // UPnP mapping description
};

struct PortMapping {
  std::uint16_t internal_port = 0;
  std::uint16_t external_port = 0;
  asio::ip::address_v4 external_ip;
  Duration lifetime{};  // granted (UPnP: what was asked; 0 = permanent)
  TimePoint renew_at{};
  TimePoint expires{};  // end of the granted lifetime (unused when permanent)
};

// The CLI's --port-mapping value: "off" (nullopt), "auto" (PCP, NAT-PMP, then UPnP), "pcp",
// "natpmp" or "upnp" (only that one); errc::invalid_argument otherwise.
result<std::optional<PortMapConfig>> port_map_mode(std::string_view mode);

// Pure helpers (unit tested).
// The TCP ports of IPv4 listen addresses a router can forward to: bound to 0.0.0.0 or to a
// non-loopback address; sorted, without duplicates. /ip6, /p2p-circuit and loopback skipped.
std::vector<std::uint16_t> mappable_ports(const std::vector<Multiaddr>& listen);
// When to renew a mapping granted for `granted` at `now`: half the lifetime (RFC 6886 §3.3),
// at least 1 s; a permanent mapping (0) is checked again after `recheck`.
TimePoint renew_time(TimePoint now, Duration granted, Duration recheck);
// The address to announce for a mapping, if any: /ip4/<external>/tcp/<port>, only for a
// public external address unless allow_private.
std::optional<Multiaddr> mapped_address(const PortMapping& m, bool allow_private);
// A PCP / NAT-PMP epoch reading: the router's seconds since its start, and when we got it.
struct RouterEpoch {
  std::uint32_t seconds = 0;
  TimePoint at{};
};
// Whether the router restarted between two readings (RFC 6886 §3.6: the epoch should have
// advanced by at least 7/8 of the time elapsed here, give or take 2 s).
bool router_restarted(const RouterEpoch& before, const RouterEpoch& now);

// One router protocol (portmap_pcp.cpp, portmap_natpmp.cpp, portmap_upnp.cpp).
class PortMapBackend {
 public:
  virtual ~PortMapBackend() = default;
  virtual const char* name() const = 0;
  // Finds the gateway and returns its external address (PCP: unspecified until the first
  // mapping tells it); errc::unavailable if none answers.
  virtual awaitable<result<asio::ip::address_v4>> discover(Duration timeout) = 0;
  // Maps TCP `internal_port` (asking for the same external port) for `lifetime`. A refusal by
  // the router is errc::unsupported with its reason; other failures (timeouts) as they are.
  virtual awaitable<result<PortMapping>> map(std::uint16_t internal_port, Duration lifetime,
                                             Duration timeout) = 0;
  virtual awaitable<result<void>> unmap(const PortMapping& m, Duration timeout) = 0;
  // The gateway's address, for log lines ("" before discover()).
  virtual std::string gateway() const = 0;
  // The router's epoch from its last answer (PCP, NAT-PMP); nullopt for protocols without one.
  virtual std::optional<RouterEpoch> epoch() const { return std::nullopt; }
};
// `server`: the PCP server to ask (tests); the default gateway's port 5351 when nullopt.
std::unique_ptr<PortMapBackend> make_pcp_backend(
    asio::any_io_executor ex, std::optional<asio::ip::udp::endpoint> server = std::nullopt);
std::unique_ptr<PortMapBackend> make_natpmp_backend(asio::any_io_executor ex);
std::unique_ptr<PortMapBackend> make_upnp_backend(asio::any_io_executor ex,
                                                  std::string description);

class PortMapper : public std::enable_shared_from_this<PortMapper> {
 public:
  struct Stats {
    std::uint64_t mapped = 0, renewed = 0, refused = 0, failed = 0, removed = 0;
    // Passes that found no port to map (loopback-only listeners): no gateway was asked.
    std::uint64_t idle = 0;
    std::uint64_t router_restarts = 0;  // epochs that went back (mappings redone)
  };
  // The backends to try, in order, each time a gateway is looked for.
  using BackendFactory = std::function<std::vector<std::unique_ptr<PortMapBackend>>()>;
  // `backends` empty: NAT-PMP then UPnP, as cfg enables them (tests pass their own).
  static std::shared_ptr<PortMapper> start(std::shared_ptr<Host> host, PortMapConfig cfg = {},
                                           BackendFactory backends = {});
  // Stops renewing, removes every mapping from the router (bounded by stop_timeout) and
  // withdraws the announced addresses.
  awaitable<void> stop();
  // The protocol of the gateway in use ("natpmp", "upnp"), empty while none answered.
  std::string protocol() const { return backend_ ? backend_->name() : ""; }
  const std::vector<PortMapping>& mappings() const { return mappings_; }
  // Waits until at least one port is mapped (or timeout).
  awaitable<result<void>> wait_mapped(Duration timeout);
  const Stats& stats() const { return stats_; }

 private:
  PortMapper(std::shared_ptr<Host> host, PortMapConfig cfg, BackendFactory backends);
  awaitable<void> loop();
  awaitable<bool> find_gateway();
  // Maps or renews each port due; returns false if the gateway stopped answering.
  awaitable<bool> refresh(const std::vector<std::uint16_t>& ports);
  void publish();
  // PCP, NAT-PMP: reads the router's epoch if a check is due; after a restart every mapping is due.
  awaitable<void> check_epoch();

  std::shared_ptr<Host> host_;
  PortMapConfig cfg_;
  BackendFactory factory_;
  std::unique_ptr<PortMapBackend> backend_;
  std::vector<PortMapping> mappings_;
  std::vector<std::uint16_t> refused_;  // ports the router refused (retried after a while)
  TimePoint retry_refused_at_{};
  TimePoint epoch_check_at_{};
  Stats stats_;
  TaskScope scope_;
  AsyncEvent changed_;
};

}  // namespace starling::net
