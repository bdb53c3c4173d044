// The cost of private runs (auth/, docs/security.md "Private runs"), each figure beside an
// anchor measured in the same run:
//  1. CPU per check: a certificate seen for the first time (decode + Ed25519 verify), seen again
//     (cache hit), and the status question every join / record / state request asks, beside the
//     Ed25519 verification the DHT already does for every signed record it reads.
//  2. Rounds on loopback: 3 peers of an open run and 3 peers of a private run (one process,
//     NetCollaboration over real hosts and DHT nodes), rounds alternating between the two runs,
//     the median wall time of a round (all three averaging `floats` floats) for each.
//   bench_private_run [rounds=10] [floats=262144]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "starling/auth/membership.hpp"
#include "support/average_all.hpp"
#include "support/crashable_node.hpp"

using namespace starling;
using namespace starling::auth;
using Clk = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Nanoseconds per call of f over n calls.
template <class F>
double ns_per(std::size_t n, F f) {
  const auto t0 = Clk::now();
  for (std::size_t i = 0; i < n; ++i) f(i);
  return std::chrono::duration<double, std::nano>(Clk::now() - t0).count() / static_cast<double>(n);
}

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

struct CpuCosts {
  double anchor, first, again, status;
};

CpuCosts cpu_costs() {
  const auto authority = crypto::KeyPair::generate();
  const Key32 run = key32(authority.public_key()).value();
  const std::uint64_t now = unix_seconds(WallClock::now());
  constexpr std::size_t kN = 2000;
  std::vector<net::PeerId> ids;
  std::vector<Bytes> certs;
  for (std::size_t i = 0; i < kN; ++i) {
    auto k = crypto::KeyPair::generate();
    ids.push_back(net::PeerId::from_public_key(k.public_key()));
    certs.push_back(encode(
        sign_certificate(authority, key32(k.public_key()).value(), now, now + 3600).value()));
  }
  // The anchor: one Ed25519 verification of a 200-byte record, as the DHT does per record.
  const auto owner = crypto::KeyPair::generate();
  const Bytes msg(200, 7);
  const Bytes sig = owner.sign(msg);
  bool ok = true;
  const double anchor =
      ns_per(kN, [&](std::size_t) { ok = owner.public_key().verify(msg, sig) && ok; });
  Membership m(run);
  const double first =
      ns_per(kN, [&](std::size_t i) { ok = m.add_certificate(ids[i], certs[i], now) && ok; });
  const double again =
      ns_per(kN, [&](std::size_t i) { ok = m.add_certificate(ids[i], certs[i], now) && ok; });
  const double status =
      ns_per(kN * 10, [&](std::size_t i) { ok = m.admits(ids[i % kN], now) && ok; });
  if (!ok) std::fprintf(stderr, "a check failed\n");
  std::printf("cpu (load %s), %zu members:\n", loadavg().c_str(), kN);
  std::printf("  anchor: DHT record signature check   %8.0f ns\n", anchor);
  std::printf("  new certificate (decode + verify)    %8.0f ns  (x%.2f the anchor)\n", first,
              first / anchor);
  std::printf("  known certificate again (cache hit)  %8.0f ns  (x%.3f)\n", again, again / anchor);
  std::printf("  member? (every join / record / state request) %6.0f ns  (x%.3f)\n", status,
              status / anchor);
  return {anchor, first, again, status};
}

using Node = std::unique_ptr<test::CrashableNode>;

std::vector<Node> start_run(const std::string& run_id, const crypto::KeyPair* authority) {
  std::vector<Node> nodes;
  for (int i = 0; i < 3; ++i) {
    auto key = crypto::KeyPair::generate();
    collab::NetCollaborationConfig c;
    c.run_id = run_id;
    c.stall_timeout = 6s;
    c.open_timeout = 20s;
    if (authority) {
      MembershipConfig m;
      m.run_key = key32(authority->public_key()).value();
      const auto now = unix_seconds(WallClock::now());
      m.certificate = encode(
          sign_certificate(*authority, key32(key.public_key()).value(), now, now + 3600).value());
      c.membership = m;
    }
    nodes.push_back(test::CrashableNode::start(
        i == 0 ? std::vector<net::Multiaddr>{} : nodes[0]->listen_addresses(), c, key));
  }
  return nodes;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 10;
  const std::size_t floats = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 262144;
  const CpuCosts cpu = cpu_costs();

  const auto authority = crypto::KeyPair::generate();
  auto open_nodes = start_run("bench-open", nullptr);
  auto private_nodes = start_run("bench-private", &authority);
  auto collabs = [](const std::vector<Node>& ns) {
    std::vector<std::shared_ptr<collab::NetCollaboration>> v;
    for (const auto& n : ns) v.push_back(n->collaboration());
    return v;
  };
  const auto open = collabs(open_nodes), priv = collabs(private_nodes);
  int failed = 0, round = 0;
  // Median round time of each run, alternating: `direct` rounds match the last group over its
  // connections (the steady state); the others match through the DHT (a 4th peer is said to
  // be live, so the group is not reused).
  auto measure = [&](bool direct) {
    std::vector<double> t[2];
    for (int r = 0; r <= rounds; ++r, ++round) {  // round 0 of each: a warm-up, not counted
      for (int which = 0; which < 2; ++which) {
        test::RoundSpec spec;
        spec.key = "grads/" + std::to_string(round);
        spec.floats = floats;
        spec.values = {1, 2, 3};
        spec.expected = {3, 3, 3};
        spec.expected_group = 3;
        spec.live_peers = direct ? 3 : 4;
        const auto t0 = Clk::now();
        auto out = test::average_all(which == 0 ? open : priv, spec);
        const double ms = std::chrono::duration<double, std::milli>(Clk::now() - t0).count();
        bool ok = true;
        for (const auto& o : out) ok = ok && o.r && o.r.value().members.size() == 3;
        if (!ok) ++failed;
        if (r > 0 && ok) t[which].push_back(ms);
      }
    }
    return std::pair{median(t[0]), median(t[1])};
  };
  const auto [mo, mp] = measure(true);
  const auto [mo_dht, mp_dht] = measure(false);
  std::printf("rounds on loopback (load %s), 3 peers, %zu floats, %d rounds each (%d failed):\n",
              loadavg().c_str(), floats, rounds, failed);
  std::printf("  matched over the last group's connections:\n");
  std::printf("    anchor: open run   median %7.1f ms a round\n", mo);
  std::printf("    private run        median %7.1f ms a round  (x%.3f)\n", mp, mp / mo);
  std::printf("  matched through the DHT:\n");
  std::printf("    anchor: open run   median %7.1f ms a round\n", mo_dht);
  std::printf("    private run        median %7.1f ms a round  (x%.3f)\n", mp_dht, mp_dht / mo_dht);
  auto s = private_nodes[0]->collaboration()->membership()->stats();
  std::printf(
      "  private peer 0: %llu reads of the members (%llu lookups for unknown peers), "
      "%llu refusals\n",
      static_cast<unsigned long long>(s.refreshes), static_cast<unsigned long long>(s.lookups),
      static_cast<unsigned long long>(s.refused));
  std::printf(
      "RESULT {\"anchor_verify_ns\":%.0f,\"new_certificate_ns\":%.0f,"
      "\"known_certificate_ns\":%.0f,\"member_check_ns\":%.0f,\"round_open_ms\":%.1f,"
      "\"round_private_ms\":%.1f,\"round_ratio\":%.3f,\"dht_round_open_ms\":%.1f,"
      "\"dht_round_private_ms\":%.1f,\"dht_round_ratio\":%.3f,\"failed_rounds\":%d}\n",
      cpu.anchor, cpu.first, cpu.again, cpu.status, mo, mp, mp / mo, mo_dht, mp_dht,
      mp_dht / mo_dht, failed);
  return failed == 0 ? 0 : 1;
}
