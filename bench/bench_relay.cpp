// Circuit relay v2 benchmark: a relayed connection (A -> relay R -> B, Noise end to end over
// the relay's streams) beside the direct connection A -> B measured in the same run, each
// host on its own io thread over loopback. Figures: connection setup (a fresh dialer each
// try, medians), ping RTT (median), 16 MiB echo throughput (median of reps), and the ratios.
//
//   bench_relay [--tries N] [--pings N] [--reps N] [--mib M] [--relay-buffer-kib K]
//   prints a table and one RESULT {json} line.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include <fmt/format.h>
#include <sodium.h>
#include <nlohmann/json.hpp>

#include "starling/core/blocking.hpp"
#include "starling/core/log.hpp"
#include "starling/net/echo.hpp"
#include "starling/net/host.hpp"
#include "starling/net/relay.hpp"

using namespace starling;
using namespace starling::net;

namespace {
double ms(Duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}
int arg(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return def;
}
template <class F>
auto run(IoThread& t, F f, Duration timeout = 120s) {
  auto r = block_on(t.executor(), std::move(f), timeout);
  if (!r) {
    std::cerr << "bench_relay: " << r.error().message() << "\n";
    std::exit(1);
  }
  return std::move(r).value();
}

struct Side {
  double setup_ms = 0, rtt_ms = 0, mib_s = 0;
};
}  // namespace

int main(int argc, char** argv) {
  if (sodium_init() < 0) return 1;
  set_log_level("warn");
  const int tries = arg(argc, argv, "--tries", 20), pings = arg(argc, argv, "--pings", 50);
  const int reps = arg(argc, argv, "--reps", 3), mib = arg(argc, argv, "--mib", 16);
  IoThread rt("relay"), bt("target"), at("dialer");
  auto relay = Host::create(rt.executor(), crypto::KeyPair::generate());
  auto target = Host::create(bt.executor(), crypto::KeyPair::generate());
  std::shared_ptr<RelayService> service;
  std::shared_ptr<RelayClient> client;
  run(rt, [&]() -> awaitable<result<void>> {
    ST_CO_TRY(co_await relay->start());
    RelayServiceConfig rc;  // the benchmark measures the path, not the limits
    rc.circuit_data = 0;
    rc.circuit_duration = Duration::zero();
    rc.buffer_size = static_cast<std::size_t>(arg(argc, argv, "--relay-buffer-kib", 16)) << 10;
    service = RelayService::start(relay, rc);
    co_return success();
  });
  Multiaddr direct, circuit;
  run(bt, [&]() -> awaitable<result<void>> {
    ST_CO_TRY(co_await target->start());
    install_echo(*target);
    RelayClientConfig cc;
    cc.relays = {relay->listen_addresses().at(0)};
    client = RelayClient::start(target, cc);
    ST_CO_TRY(co_await client->wait_reservations(1, 10s));
    direct = target->listen_addresses().at(0);
    circuit = client->reservations().at(0).addrs.at(0).with_peer_id(target->local_peer());
    co_return success();
  });
  Bytes payload(static_cast<std::size_t>(mib) << 20);
  randombytes_buf(payload.data(), payload.size());
  // Setup: a fresh dialer per try, direct and relayed tries interleaved.
  Side dir, rel;
  std::vector<double> setup[2], rtt[2], tput[2];
  const Multiaddr* addrs[2] = {&direct, &circuit};
  for (int i = 0; i < tries; ++i)
    for (int k = 0; k < 2; ++k) {
      auto a = Host::create(at.executor(), crypto::KeyPair::generate());
      auto d = run(at, [&]() -> awaitable<result<Duration>> {
        ST_CO_TRY(co_await a->start());
        auto t0 = Clock::now();
        ST_CO_TRY(co_await a->connect(*addrs[k]));
        auto took = Clock::now() - t0;
        co_await a->stop();
        co_return took;
      });
      setup[k].push_back(ms(d));
    }
  // RTT and throughput: one dialer per path, kept connected, measurements interleaved.
  std::shared_ptr<Host> dialers[2] = {Host::create(at.executor(), crypto::KeyPair::generate()),
                                      Host::create(at.executor(), crypto::KeyPair::generate())};
  for (int k = 0; k < 2; ++k)
    run(at, [&]() -> awaitable<result<void>> {
      ST_CO_TRY(co_await dialers[k]->start());
      ST_CO_TRY(co_await dialers[k]->connect(*addrs[k]));
      co_return success();
    });
  for (int rep = 0; rep < reps; ++rep)
    for (int k = 0; k < 2; ++k)
      run(at, [&]() -> awaitable<result<void>> {
        auto& a = dialers[k];
        ST_CO_TRY(auto r, co_await ping(*a, target->local_peer(), pings / reps + 1, 60s));
        for (auto x : r) rtt[k].push_back(ms(x));
        auto t1 = Clock::now();
        ST_CO_TRY(auto back, co_await echo(*a, target->local_peer(), payload, 120s));
        if (back != payload) co_return make_error(errc::internal, "echo mismatch");
        tput[k].push_back(mib / std::chrono::duration<double>(Clock::now() - t1).count());
        co_return success();
      });
  for (int k = 0; k < 2; ++k) {
    auto c = dialers[k]->connections();
    auto to_target = std::find_if(c.begin(), c.end(),
                                  [&](const auto& x) { return x.peer == target->local_peer(); });
    if (to_target == c.end() || to_target->relayed != (k == 1)) {
      std::cerr << "bench_relay: the " << (k ? "relayed" : "direct") << " path was not used\n";
      return 1;
    }
    run(at, [&]() -> awaitable<result<void>> {
      co_await dialers[k]->stop();
      co_return success();
    });
  }
  dir = {median(setup[0]), median(rtt[0]), median(tput[0])};
  rel = {median(setup[1]), median(rtt[1]), median(tput[1])};
  std::cout << fmt::format("{:<34}{:>12}{:>12}{:>10}\n", "loopback, medians", "direct", "relayed",
                           "ratio");
  std::cout << fmt::format("{:<34}{:>12.2f}{:>12.2f}{:>10.2f}\n",
                           fmt::format("connection setup, ms ({} tries)", tries), dir.setup_ms,
                           rel.setup_ms, rel.setup_ms / dir.setup_ms);
  std::cout << fmt::format("{:<34}{:>12.3f}{:>12.3f}{:>10.2f}\n",
                           fmt::format("ping RTT, ms ({} pings)", pings), dir.rtt_ms, rel.rtt_ms,
                           rel.rtt_ms / dir.rtt_ms);
  std::cout << fmt::format("{:<34}{:>12.1f}{:>12.1f}{:>10.2f}\n",
                           fmt::format("{} MiB echo, MiB/s ({} reps)", mib, reps), dir.mib_s,
                           rel.mib_s, rel.mib_s / dir.mib_s);
  nlohmann::json j{{"setup_ms", {dir.setup_ms, rel.setup_ms}},
                   {"rtt_ms", {dir.rtt_ms, rel.rtt_ms}},
                   {"echo_mib_s", {dir.mib_s, rel.mib_s}},
                   {"relay_bytes", service->stats().bytes_relayed}};
  std::cout << "RESULT " << j.dump() << std::endl;
  run(bt, [&]() -> awaitable<result<void>> {
    co_await client->stop();
    co_await target->stop();
    co_return success();
  });
  run(rt, [&]() -> awaitable<result<void>> {
    co_await service->stop();
    co_await relay->stop();
    co_return success();
  });
  return 0;
}
