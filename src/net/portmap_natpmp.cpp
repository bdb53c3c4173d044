// NAT-PMP (RFC 6886) port mapping with libnatpmp, on the executor: libnatpmp's socket is
// non-blocking, so a request is sent, the socket awaited until readable or until libnatpmp's
// next retransmission is due (250 ms doubling), and the whole exchange bounded by a deadline.
// libnatpmp parses the answers and accepts them only from the gateway's address.
#define ENABLE_STRNATPMPERR
#include <arpa/inet.h>
#include <natpmp.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>
#include <asio/posix/stream_descriptor.hpp>

#include "starling/net/portmap.hpp"

namespace starling::net {

namespace {

Error natpmp_error(int code, const char* what) {
  const char* text = strnatpmperr(code);
  std::string msg = fmt::format("NAT-PMP {}: {} ({})", what, text ? text : "error", code);
  switch (code) {
    // The gateway answered with a result code: it refuses.
    case NATPMP_ERR_NOTAUTHORIZED:
    case NATPMP_ERR_NETWORKFAILURE:
    case NATPMP_ERR_OUTOFRESOURCES:
    case NATPMP_ERR_UNSUPPORTEDOPCODE:
    case NATPMP_ERR_UNDEFINEDERROR:
      return make_error(errc::unsupported, msg);
    case NATPMP_ERR_NOGATEWAYSUPPORT:  // no answer after the retransmissions
    case NATPMP_ERR_RECVFROM:          // ICMP port unreachable: nothing listens
    case NATPMP_ERR_CANNOTGETGATEWAY:
    case NATPMP_ERR_UNSUPPORTEDVERSION:
      return make_error(errc::unavailable, msg);
    default:
      return make_error(errc::io, msg);
  }
}

class NatpmpBackend final : public PortMapBackend {
 public:
  explicit NatpmpBackend(asio::any_io_executor ex) : ex_(std::move(ex)) {}
  ~NatpmpBackend() override {
    if (open_) closenatpmp(&n_);
  }
  const char* name() const override { return "natpmp"; }
  std::string gateway() const override { return gateway_; }
  std::optional<RouterEpoch> epoch() const override { return epoch_; }

  awaitable<result<asio::ip::address_v4>> discover(Duration timeout) override {
    if (!open_) {
      if (int r = initnatpmp(&n_, 0, 0); r < 0) co_return natpmp_error(r, "no gateway");
      open_ = true;
      in_addr gw{};
      gw.s_addr = n_.gateway;
      char text[INET_ADDRSTRLEN] = {};
      gateway_ = inet_ntop(AF_INET, &gw, text, sizeof text) ? text : "?";
    }
    co_return co_await public_address(Clock::now() + timeout);
  }

  awaitable<result<PortMapping>> map(std::uint16_t port, Duration lifetime,
                                     Duration timeout) override {
    if (!open_) co_return make_error(errc::unavailable, "NAT-PMP: no gateway");
    const auto deadline = Clock::now() + timeout;
    // The external address may have changed since the last request: ask each time.
    ST_CO_TRY(auto ext, co_await public_address(deadline));
    const auto secs = static_cast<std::uint32_t>(std::clamp<std::int64_t>(
        std::chrono::duration_cast<std::chrono::seconds>(lifetime).count(), 1, 1 << 30));
    if (int r = sendnewportmappingrequest(&n_, NATPMP_PROTOCOL_TCP, port, port, secs); r < 0)
      co_return natpmp_error(r, "sending the mapping request");
    ST_CO_TRY(auto resp, co_await exchange(deadline));
    if (resp.type != NATPMP_RESPTYPE_TCPPORTMAPPING || resp.pnu.newportmapping.privateport != port)
      co_return make_error(errc::protocol_violation, "NAT-PMP: answer for another mapping");
    PortMapping m;
    m.internal_port = port;
    m.external_port = resp.pnu.newportmapping.mappedpublicport;
    m.external_ip = ext;
    m.lifetime = std::chrono::seconds(resp.pnu.newportmapping.lifetime);
    if (m.external_port == 0 || m.lifetime == Duration::zero())
      co_return make_error(errc::unsupported, "NAT-PMP: the gateway granted no mapping");
    co_return m;
  }

  awaitable<result<void>> unmap(const PortMapping& m, Duration timeout) override {
    if (!open_) co_return make_error(errc::unavailable, "NAT-PMP: no gateway");
    // Lifetime 0 deletes the mapping of this internal port (RFC 6886 §3.4).
    if (int r = sendnewportmappingrequest(&n_, NATPMP_PROTOCOL_TCP, m.internal_port, 0, 0); r < 0)
      co_return natpmp_error(r, "sending the removal");
    ST_CO_TRY(co_await exchange(Clock::now() + timeout));
    co_return success();
  }

 private:
  awaitable<result<asio::ip::address_v4>> public_address(TimePoint deadline) {
    if (int r = sendpublicaddressrequest(&n_); r < 0)
      co_return natpmp_error(r, "sending the address request");
    ST_CO_TRY(auto resp, co_await exchange(deadline));
    if (resp.type != NATPMP_RESPTYPE_PUBLICADDRESS)
      co_return make_error(errc::protocol_violation, "NAT-PMP: unexpected answer");
    co_return asio::ip::address_v4(ntohl(resp.pnu.publicaddress.addr.s_addr));
  }

  // Waits for the answer to the pending request, letting libnatpmp retransmit, until
  // `deadline`.
  awaitable<result<natpmpresp_t>> exchange(TimePoint deadline) {
    // A duplicate descriptor: asio may close its own, never libnatpmp's.
    int fd = ::dup(n_.s);
    if (fd < 0) co_return make_error(errc::io, "NAT-PMP: dup failed");
    asio::posix::stream_descriptor sock(ex_, fd);
    for (;;) {
      natpmpresp_t resp{};
      const int r = readnatpmpresponseorretry(&n_, &resp);
      if (r == 0) {
        epoch_ = RouterEpoch{resp.epoch, Clock::now()};
        co_return resp;
      }
      if (r != NATPMP_TRYAGAIN) co_return natpmp_error(r, "request");
      timeval tv{};
      if (getnatpmprequesttimeout(&n_, &tv) < 0) co_return make_error(errc::io, "NAT-PMP timer");
      const auto now = Clock::now();
      if (now >= deadline)
        co_return make_error(errc::timeout, "NAT-PMP: no answer from " + gateway_);
      const Duration retry =
          std::chrono::seconds(tv.tv_sec) + std::chrono::microseconds(tv.tv_usec);
      const Duration wait = std::clamp<Duration>(retry, 1ms, deadline - now);
      auto readable = [&]() -> awaitable<result<void>> {
        auto [ec] = co_await sock.async_wait(asio::posix::descriptor_base::wait_read, use_nothrow);
        if (ec) co_return from_asio(ec, "NAT-PMP socket");
        co_return success();
      };
      auto w = co_await with_timeout(readable(), wait, "NAT-PMP wait");
      if (!w && w.error() == errc::cancelled) co_return w.error();
      if (!w && w.error() != errc::timeout) co_return w.error();
    }
  }

  asio::any_io_executor ex_;
  natpmp_t n_{};
  bool open_ = false;
  std::string gateway_;
  std::optional<RouterEpoch> epoch_;
};

}  // namespace

std::unique_ptr<PortMapBackend> make_natpmp_backend(asio::any_io_executor ex) {
  return std::make_unique<NatpmpBackend>(std::move(ex));
}

}  // namespace starling::net
