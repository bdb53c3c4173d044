// UPnP IGD port mapping with libminiupnpc (SSDP discovery, the IGD's description, SOAP
// AddPortMapping / DeletePortMapping / GetExternalIPAddress; the library parses the replies).
// libminiupnpc blocks, so each call runs on a detached thread of its own that owns copies of
// everything it uses; the executor polls for its result until a deadline and then gives up,
// leaving the thread to end on the library's socket timeouts.
#include <miniupnpc/miniupnpc.h>
#include <miniupnpc/upnpcommands.h>
#include <miniupnpc/upnperrors.h>

#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "starling/net/portmap.hpp"

namespace starling::net {

namespace {

template <class T>
struct Blocking {
  std::mutex mu;
  std::optional<result<T>> value;
};

// Polls `st` until the thread filled it or `timeout` passed.
template <class T>
awaitable<result<T>> await_blocking(std::shared_ptr<Blocking<T>> st, Duration timeout,
                                    std::string what) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    {
      std::lock_guard lock(st->mu);
      if (st->value) co_return std::move(*st->value);
    }
    if (Clock::now() >= deadline) co_return make_error(errc::timeout, what);
    if (auto s = co_await sleep_for(10ms); !s) co_return s.error();  // cancelled
  }
}

// Runs `f` on a new detached thread and waits for its result for at most `timeout`. Not a
// coroutine: `f` is moved to the thread before anything is awaited (GCC 12 mishandles
// temporaries captured in co_await expressions).
template <class T, class F>
awaitable<result<T>> run_blocking(F f, Duration timeout, std::string what) {
  auto st = std::make_shared<Blocking<T>>();
  try {
    std::thread([st, f = std::move(f)]() mutable {
      result<T> r = f();
      std::lock_guard lock(st->mu);
      st->value.emplace(std::move(r));
    }).detach();
  } catch (const std::system_error& e) {
    st->value.emplace(make_error(errc::io, what + ": cannot start a thread: " + e.what()));
  }
  return await_blocking<T>(std::move(st), timeout, std::move(what));
}

// What the calls need from the discovered IGD (copied into every call's thread).
struct Igd {
  std::string control_url, service_type, lan_addr, gateway;
};
using FoundIgd = std::pair<Igd, asio::ip::address_v4>;  // and its external address

// A UPnP error code from the router is a refusal; negative codes are local/HTTP failures.
Error upnp_error(int code, const char* what) {
  const char* text = strupnperror(code);
  auto msg = fmt::format("UPnP {}: {} ({})", what, text ? text : "error", code);
  if (code > 0) return make_error(errc::unsupported, msg);
  return make_error(code == UPNPCOMMAND_HTTP_ERROR ? errc::unavailable : errc::io, msg);
}

result<asio::ip::address_v4> external_ip(const Igd& g) {
  char ext[64] = {};
  const int r = UPNP_GetExternalIPAddress(g.control_url.c_str(), g.service_type.c_str(), ext);
  if (r != UPNPCOMMAND_SUCCESS) return upnp_error(r, "GetExternalIPAddress");
  std::error_code ec;
  auto ip = asio::ip::make_address_v4(ext, ec);
  if (ec)
    return make_error(errc::protocol_violation,
                      fmt::format("UPnP: bad external address '{}'", ext));
  return ip;
}

result<FoundIgd> discover_igd(int delay_ms) {
  int err = 0;
  UPNPDev* devs = upnpDiscover(delay_ms, nullptr, nullptr, UPNP_LOCAL_PORT_ANY, 0, 2, &err);
  if (!devs)
    return make_error(errc::unavailable,
                      fmt::format("UPnP: no device answered the SSDP search (error {})", err));
  UPNPUrls urls{};
  IGDdatas data{};
  char lan[64] = {};
  const int v = UPNP_GetValidIGD(devs, &urls, &data, lan, sizeof lan);
  freeUPNPDevlist(devs);
  if (v != 1) {
    if (v != 0) FreeUPNPUrls(&urls);
    return make_error(errc::unavailable, v == 2   ? "UPnP: the IGD is not connected"
                                         : v == 3 ? "UPnP: no IGD among the devices found"
                                                  : "UPnP: no IGD found");
  }
  Igd g{urls.controlURL ? urls.controlURL : "", data.first.servicetype, lan, ""};
  if (urls.rootdescURL) g.gateway = urls.rootdescURL;
  FreeUPNPUrls(&urls);
  if (g.control_url.empty()) return make_error(errc::unavailable, "UPnP: IGD without control URL");
  auto ext = external_ip(g);
  if (!ext) return ext.error();
  return std::make_pair(std::move(g), ext.value());
}

result<PortMapping> add_mapping(const Igd& g, std::uint16_t port, Duration lifetime,
                                const std::string& desc) {
  const auto p = std::to_string(port);
  auto lease = std::to_string(std::chrono::duration_cast<std::chrono::seconds>(lifetime).count());
  auto add = [&] {
    return UPNP_AddPortMapping(g.control_url.c_str(), g.service_type.c_str(), p.c_str(), p.c_str(),
                               g.lan_addr.c_str(), desc.c_str(), "TCP", nullptr, lease.c_str());
  };
  PortMapping m;
  m.internal_port = port;
  m.external_port = port;
  int r = add();
  if (r == 725) {  // OnlyPermanentLeasesSupported: a lease of 0, removed on stop
    lease = "0";
    r = add();
  }
  if (r == 718) {  // ConflictInMappingEntry: another client has this external port
    char reserved[16] = {};
    r = UPNP_AddAnyPortMapping(g.control_url.c_str(), g.service_type.c_str(), p.c_str(), p.c_str(),
                               g.lan_addr.c_str(), desc.c_str(), "TCP", nullptr, lease.c_str(),
                               reserved);
    if (r == UPNPCOMMAND_SUCCESS) {
      const long other = std::strtol(reserved, nullptr, 10);
      if (other <= 0 || other > 65535)
        return make_error(errc::protocol_violation, "UPnP: bad reserved port");
      m.external_port = static_cast<std::uint16_t>(other);
    }
  }
  if (r != UPNPCOMMAND_SUCCESS) return upnp_error(r, "AddPortMapping");
  m.lifetime = std::chrono::seconds(std::stoll(lease));
  auto ext = external_ip(g);
  if (!ext) return ext.error();
  m.external_ip = ext.value();
  return m;
}

class UpnpBackend final : public PortMapBackend {
 public:
  UpnpBackend(std::string description) : desc_(std::move(description)) {}
  const char* name() const override { return "upnp"; }
  std::string gateway() const override { return igd_ ? igd_->gateway : ""; }

  awaitable<result<asio::ip::address_v4>> discover(Duration timeout) override {
    // SSDP waits up to `delay` per search type: a third of the budget leaves room for the
    // description fetch and the first SOAP call.
    const int delay = static_cast<int>(std::clamp<std::int64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(timeout / 3).count(), 100, 5000));
    auto job = [delay] { return discover_igd(delay); };
    auto waiting = run_blocking<FoundIgd>(std::move(job), timeout, "UPnP discovery");
    ST_CO_TRY(auto found, co_await std::move(waiting));
    igd_ = std::make_shared<const Igd>(std::move(found.first));
    co_return found.second;
  }

  awaitable<result<PortMapping>> map(std::uint16_t port, Duration lifetime,
                                     Duration timeout) override {
    if (!igd_) co_return make_error(errc::unavailable, "UPnP: no gateway");
    auto job = [g = igd_, port, lifetime, desc = desc_] {
      return add_mapping(*g, port, lifetime, desc);
    };
    auto waiting = run_blocking<PortMapping>(std::move(job), timeout, "UPnP AddPortMapping");
    auto r = co_await std::move(waiting);
    co_return r;
  }

  awaitable<result<void>> unmap(const PortMapping& m, Duration timeout) override {
    if (!igd_) co_return make_error(errc::unavailable, "UPnP: no gateway");
    auto job = [g = igd_, ext = std::to_string(m.external_port)]() -> result<void> {
      const int r = UPNP_DeletePortMapping(g->control_url.c_str(), g->service_type.c_str(),
                                           ext.c_str(), "TCP", nullptr);
      if (r != UPNPCOMMAND_SUCCESS) return upnp_error(r, "DeletePortMapping");
      return success();
    };
    auto waiting = run_blocking<void>(std::move(job), timeout, "UPnP DeletePortMapping");
    auto r = co_await std::move(waiting);
    co_return r;
  }

 private:
  std::string desc_;
  std::shared_ptr<const Igd> igd_;
};

}  // namespace

std::unique_ptr<PortMapBackend> make_upnp_backend(asio::any_io_executor, std::string description) {
  return std::make_unique<UpnpBackend>(std::move(description));
}

}  // namespace starling::net
