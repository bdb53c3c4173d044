// One averaging peer as a process, for tests/integration/averaging_multiprocess.sh: peers on
// one machine meet through a FileDirectory (matchmaking, no fixed group), average a tensor
// of `--elems` floats for `--steps` steps and print one JSON line per step: whether it
// succeeded, the group size, a hash of the resulting tensor (identical on every member that
// succeeded) and, in step 0 with every peer present, the largest error against the exact
// weighted mean (weights index+1). `--die-at PHASE` makes this process exit abruptly when its
// second step enters PHASE ("reduce-scatter", "all-gather", ...): a crash mid-round.
//
//   averaging_node --index I --peers N --dir D [--elems E] [--steps K] [--codec C]
//                  [--die-at PHASE]
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "starling/averaging/averager.hpp"
#include "starling/averaging/host_address_sink.hpp"
#include "starling/core/blocking.hpp"
#include "starling/core/log.hpp"
#include "starling/net/host.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace std::chrono_literals;

namespace {

struct Args {
  int index = -1, peers = 0, steps = 2;
  std::uint64_t elems = 200000;
  std::string dir, codec = "none", die_at;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--index")
      a.index = std::stoi(v);
    else if (k == "--peers")
      a.peers = std::stoi(v);
    else if (k == "--dir")
      a.dir = v;
    else if (k == "--elems")
      a.elems = std::stoull(v);
    else if (k == "--steps")
      a.steps = std::stoi(v);
    else if (k == "--codec")
      a.codec = v;
    else if (k == "--die-at")
      a.die_at = v;
    else
      throw std::runtime_error("unknown option " + k);
  }
  if (a.index < 0 || a.peers < 2 || a.dir.empty())
    throw std::runtime_error("usage: averaging_node --index I --peers N --dir D [...]");
  return a;
}

float initial(int index, std::uint64_t i) {
  return static_cast<float>((index + 1) * std::sin(0.001 * static_cast<double>(i)) + index);
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  std::thread th([&] { io.run(); });

  net::HostConfig hc;
  hc.listen = {"/ip4/127.0.0.1/tcp/0"};
  auto host = net::Host::create(io.get_executor(), crypto::KeyPair::generate(), hc);
  auto st = block_on(
      io.get_executor(), [host]() { return host->start(); }, 30s);
  if (!st) throw std::runtime_error(st.error().message());
  std::vector<std::string> addrs;
  for (const auto& m : host->listen_addresses()) addrs.push_back(m.to_string());

  std::vector<float> x(a.elems);
  for (std::uint64_t i = 0; i < a.elems; ++i) x[i] = initial(a.index, i);
  Schema schema{{{"x", {static_cast<std::int64_t>(a.elems)}, DType::f32}}, a.codec};
  AveragerConfig cfg;
  cfg.key = {"multiprocess", 16, 0};
  cfg.addrs = addrs;
  cfg.round.part_elems = 16384;
  cfg.round.stall_timeout = 10s;
  cfg.open_timeout = 30s;
  cfg.matchmaking.target_group_size = static_cast<std::size_t>(a.peers);
  cfg.matchmaking.min_group_size = static_cast<std::size_t>(a.peers);
  cfg.matchmaking.min_wait = 1s;
  cfg.matchmaking.settle = 500ms;
  cfg.matchmaking.refresh_interval = 200ms;
  int step_no = 0;
  if (!a.die_at.empty())
    cfg.on_phase = [&](const std::string& phase) {
      if (step_no == 1 && phase.rfind(a.die_at, 0) == 0) {
        std::fprintf(stderr, "averaging_node %d: dying in %s\n", a.index, phase.c_str());
        std::_Exit(9);
      }
    };
  auto sink = averaging::host_address_sink(host);
  auto avg =
      Averager::create(host, std::make_shared<FileDirectory>(a.dir), schema, {{"x", x}}, cfg, sink);
  if (!avg) throw std::runtime_error(avg.error().message());
  for (; step_no < a.steps; ++step_no) {
    StepOptions so;
    so.weight = a.index + 1;
    so.timeout = 90s;
    so.matchmaking_timeout = 60s;
    auto r = avg.value()->step_blocking(so);
    nlohmann::json out{{"index", a.index}, {"step", step_no}, {"ok", static_cast<bool>(r)}};
    if (!r) {
      out["error"] = r.error().message();
    } else {
      const auto& res = r.value();
      out["group"] = res.group.members.size();
      out["subrounds"] = res.subrounds;
      Bytes h = blake2b_256(
          BytesView(reinterpret_cast<const std::uint8_t*>(x.data()), x.size() * sizeof(float)));
      out["hash"] = to_hex(h);
      if (step_no == 0 && res.group.members.size() == static_cast<std::size_t>(a.peers)) {
        double wsum = 0, worst = 0;
        for (int j = 0; j < a.peers; ++j) wsum += j + 1;
        for (std::uint64_t i = 0; i < a.elems; ++i) {
          double want = 0;
          for (int j = 0; j < a.peers; ++j) want += (j + 1) / wsum * initial(j, i);
          worst = std::max(worst, std::abs(x[i] - want));
        }
        out["max_error"] = worst;
      }
    }
    std::cout << out.dump() << std::endl;
  }
  (void)block_on(
      io.get_executor(),
      [a = avg.value(), host]() -> awaitable<result<void>> {
        co_await a->stop();
        co_await host->stop();
        co_return success();
      },
      30s);
  guard.reset();
  io.stop();
  th.join();
  return 0;
} catch (const std::exception& e) {
  std::cerr << "averaging_node: " << e.what() << std::endl;
  return 2;
}
