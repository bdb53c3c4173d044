// PCP (RFC 6887) port mapping on the executor: one connected UDP socket to the gateway's port
// 5351 (the kernel drops datagrams from anyone else), requests retransmitted per §8.1.1
// (first after 3 s, doubling, +-10%) until the caller's deadline. Each mapping keeps its
// nonce for its renewals and its removal. PCP has no "external address" request: discover()
// sends ANNOUNCE (the gateway must answer it, §14.1) and the external address is learned from
// the first MAP answer. A gateway that speaks only NAT-PMP answers PCP with NAT-PMP's
// "unsupported version": discover() reports it unavailable so the NAT-PMP backend takes over.
#include <arpa/inet.h>
#include <natpmp.h>
#include <sodium.h>

#include <algorithm>
#include <map>
#include <random>

#include <fmt/format.h>
#include <asio/ip/udp.hpp>

#include "starling/net/pcp.hpp"
#include "starling/net/portmap.hpp"

namespace starling::net {

namespace {

class PcpBackend final : public PortMapBackend {
 public:
  PcpBackend(asio::any_io_executor ex, std::optional<asio::ip::udp::endpoint> server)
      : sock_(ex), server_(server) {}
  const char* name() const override { return "pcp"; }
  std::string gateway() const override {
    return server_ ? fmt::format("{}:{}", server_->address().to_string(), server_->port()) : "";
  }
  std::optional<RouterEpoch> epoch() const override { return epoch_; }

  awaitable<result<asio::ip::address_v4>> discover(Duration timeout) override {
    ST_CO_TRY(open());
    const auto deadline = Clock::now() + timeout;
    ST_CO_TRY(auto r,
              co_await exchange(pcp::encode_announce(client_), pcp::kOpAnnounce, {}, deadline));
    if (r.result != 0)
      co_return make_error(errc::unavailable, "PCP ANNOUNCE: " + pcp::result_name(r.result));
    co_return external_;  // unspecified until a mapping told us
  }

  awaitable<result<PortMapping>> map(std::uint16_t port, Duration lifetime,
                                     Duration timeout) override {
    ST_CO_TRY(open());
    auto [it, fresh] = nonces_.try_emplace(port);
    if (fresh) randombytes_buf(it->second.data(), it->second.size());
    pcp::MapRequest req;
    req.client = client_;
    req.nonce = it->second;
    req.internal_port = port;
    req.suggested_external_port = port;
    req.lifetime = static_cast<std::uint32_t>(std::clamp<std::int64_t>(
        std::chrono::duration_cast<std::chrono::seconds>(lifetime).count(), 1, 1 << 30));
    ST_CO_TRY(auto r,
              co_await exchange(pcp::encode_map(req), pcp::kOpMap, req, Clock::now() + timeout));
    if (r.result != 0)
      co_return make_error(errc::unsupported, "PCP MAP: " + pcp::result_name(r.result));
    if (r.external_port == 0 || r.lifetime == 0)
      co_return make_error(errc::unsupported, "PCP: the gateway granted no mapping");
    external_ = r.external_ip;
    PortMapping m;
    m.internal_port = port;
    m.external_port = r.external_port;
    m.external_ip = r.external_ip;
    m.lifetime = std::chrono::seconds(r.lifetime);
    co_return m;
  }

  awaitable<result<void>> unmap(const PortMapping& m, Duration timeout) override {
    ST_CO_TRY(open());
    auto it = nonces_.find(m.internal_port);
    if (it == nonces_.end()) co_return make_error(errc::not_found, "PCP: no such mapping");
    pcp::MapRequest req;
    req.client = client_;
    req.nonce = it->second;
    req.internal_port = m.internal_port;
    req.lifetime = 0;  // deletes the mapping (§15)
    ST_CO_TRY(auto r,
              co_await exchange(pcp::encode_map(req), pcp::kOpMap, req, Clock::now() + timeout));
    if (r.result != 0)
      co_return make_error(errc::unsupported, "PCP MAP delete: " + pcp::result_name(r.result));
    nonces_.erase(it);
    co_return success();
  }

 private:
  result<void> open() {
    if (sock_.is_open()) return success();
    if (!server_) {  // the default gateway, as libnatpmp finds it
      natpmp_t n{};
      if (initnatpmp(&n, 0, 0) < 0) return make_error(errc::unavailable, "PCP: no gateway");
      server_ = asio::ip::udp::endpoint(asio::ip::address_v4(ntohl(n.gateway)), pcp::kServerPort);
      closenatpmp(&n);
    }
    std::error_code ec;
    sock_.open(asio::ip::udp::v4(), ec);
    if (!ec) sock_.connect(*server_, ec);
    if (ec) {
      sock_.close();
      return from_asio(ec, "PCP socket");
    }
    // The client address field must be the request's source address (§8.1).
    client_ = sock_.local_endpoint(ec).address().to_v4();
    if (ec) return from_asio(ec, "PCP socket");
    return success();
  }

  // Sends `msg` and waits for its answer, retransmitting, until `deadline`. Answers that do
  // not match the request (another opcode, nonce, protocol or port) are ignored (§11.3).
  awaitable<result<pcp::Response>> exchange(Bytes msg, std::uint8_t opcode, pcp::MapRequest req,
                                            TimePoint deadline) {
    std::uniform_real_distribution<double> jitter(0.9, 1.1);
    Duration rt = std::chrono::duration_cast<Duration>(3s * jitter(rng_));
    std::array<std::uint8_t, pcp::kMaxMessage + 4> buf{};
    std::string last_error;
    for (;;) {
      auto [ec, n] = co_await sock_.async_send(asio::buffer(msg), use_nothrow);
      if (ec) co_return from_asio(ec, "PCP send");
      const auto resend_at = Clock::now() + rt;
      for (;;) {
        const auto now = Clock::now();
        if (now >= deadline)
          co_return make_error(errc::timeout,
                               fmt::format("PCP: no answer from {}{}", gateway(), last_error));
        if (now >= resend_at) break;
        auto recv = [&]() -> awaitable<result<std::size_t>> {
          auto [rec, got] = co_await sock_.async_receive(asio::buffer(buf), use_nothrow);
          if (rec) co_return from_asio(rec, "PCP receive");
          co_return got;
        };
        auto got = co_await with_timeout(recv(), std::min(resend_at, deadline) - now, "PCP");
        if (!got && got.error() == errc::timeout) continue;
        if (!got && got.error() == errc::cancelled) co_return got.error();
        // ICMP port unreachable (nothing listens on 5351) shows up as a refused receive.
        if (!got) co_return make_error(errc::unavailable, got.error().message());
        auto r = pcp::parse_response(BytesView(buf.data(), got.value()));
        if (!r && r.error() == errc::unsupported)
          co_return make_error(errc::unavailable, r.error().message());
        if (!r) {
          last_error = " (ignored: " + r.error().message() + ")";
          continue;
        }
        const auto& a = r.value();
        if (a.opcode != opcode) continue;
        if (opcode == pcp::kOpMap && (a.nonce != req.nonce || a.protocol != req.protocol ||
                                      a.internal_port != req.internal_port))
          continue;
        epoch_ = RouterEpoch{a.epoch, Clock::now()};
        co_return a;
      }
      rt = std::min<Duration>(rt * 2, 1024s);
    }
  }

  asio::ip::udp::socket sock_;
  std::optional<asio::ip::udp::endpoint> server_;
  asio::ip::address_v4 client_;
  asio::ip::address_v4 external_;
  std::map<std::uint16_t, pcp::Nonce> nonces_;
  std::optional<RouterEpoch> epoch_;
  std::minstd_rand rng_{std::random_device{}()};
};

}  // namespace

std::unique_ptr<PortMapBackend> make_pcp_backend(asio::any_io_executor ex,
                                                 std::optional<asio::ip::udp::endpoint> server) {
  return std::make_unique<PcpBackend>(std::move(ex), server);
}

}  // namespace starling::net
