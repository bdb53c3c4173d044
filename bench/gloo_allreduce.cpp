// The anchor for bench/run-allreduce.sh: Gloo's ring all-reduce (gloo::AllreduceRing<float>,
// TCP transport, Debian's libgloo-dev) on `--elems` float32 among `--size` processes that meet
// through a gloo FileStore in `--dir`. One warm-up run, then `--iters` timed runs, each after a
// gloo barrier. Prints one JSON line like bench_allreduce (with the process's CPU time per run).
//
//   gloo_allreduce --rank R --size N --dir D [--elems E] [--iters K] [--host IP]
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_cpu.hpp"

using starling::bench::process_cpu_s;

int main(int argc, char** argv) try {
  int rank = -1, size = 0, iters = 5;
  std::string dir, host = "127.0.0.1";
  std::size_t elems = 16u << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--rank")
      rank = std::stoi(v);
    else if (k == "--size")
      size = std::stoi(v);
    else if (k == "--dir")
      dir = v;
    else if (k == "--elems")
      elems = std::stoull(v);
    else if (k == "--iters")
      iters = std::stoi(v);
    else if (k == "--host")
      host = v;
    else
      throw std::runtime_error("unknown option " + k);
  }
  if (rank < 0 || size < 1 || dir.empty())
    throw std::runtime_error("usage: gloo_allreduce --rank R --size N --dir D [...]");

  gloo::transport::tcp::attr attr;
  attr.hostname = host;
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(dir);
  gloo::rendezvous::PrefixStore prefix("allreduce", store);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(std::chrono::seconds(300));
  ctx->connectFullMesh(prefix, dev);

  std::vector<float> x(elems);
  gloo::AllreduceRing<float> ring(ctx, {x.data()}, static_cast<int>(elems));
  gloo::BarrierAllToOne barrier(ctx);
  std::vector<double> times, cpu_times;
  double max_err = 0;
  const double want0 = size * (size + 1) / 2.0;  // sum of rank+1 over ranks
  for (int it = -1; it < iters; ++it) {
    for (std::size_t i = 0; i < elems; ++i)
      x[i] = static_cast<float>(rank + 1) + static_cast<float>(i % 7);
    barrier.run();
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_s();
    ring.run();
    const double cpu_round = process_cpu_s() - c0;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (std::size_t i = 0; i < elems; i += 4099)
      max_err = std::max(max_err, std::abs(x[i] - (want0 + static_cast<double>(size) * (i % 7))));
    if (it >= 0) {
      times.push_back(secs);
      cpu_times.push_back(cpu_round);
    }
  }
  barrier.run();
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  nlohmann::json out{{"rank", rank},
                     {"size", size},
                     {"bytes", elems * sizeof(float)},
                     {"times_s", times},
                     {"median_s", sorted.empty() ? 0.0 : sorted[sorted.size() / 2]},
                     {"max_abs_error", max_err},
                     {"cpu_per_round_s", cpu_times}};
  std::cout << out.dump() << std::endl;
  return max_err < 1e-2 * size ? 0 : 3;
} catch (const std::exception& e) {
  std::cerr << "gloo_allreduce: " << e.what() << std::endl;
  return 2;
}
