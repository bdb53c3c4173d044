// All-reduce benchmark, one process per member: Starling's averaging round (Noise + yamux
// streams, butterfly reduce-scatter/all-gather) on `--elems` float32 among `--size` processes.
// Processes meet through a FileDirectory in `--dir`, then run `--iters` timed rounds (after one
// warm-up round that also opens the connections), each after a barrier. Prints one JSON line.
// The JSON also has cpu_s and runq_wait_s: CPU time of all threads over the whole run, and
// the time they were runnable but waiting for a CPU (on a loaded machine, that is the gap);
// cpu_per_round_s: the process's CPU time (all threads) during each timed step; and
// cipher_floor_s: the CPU time one thread needs to seal and open the bytes this member moves
// in a round, 2(n-1)/n of the vector each way, in 65519-byte Noise frames (the part of a
// round's CPU that encryption alone makes unavoidable).
// bench/run-allreduce.sh runs it beside Gloo's ring all-reduce (bench/gloo_allreduce.cpp).
//
//   bench_allreduce --rank R --size N --dir D [--elems E] [--iters K] [--part-kb P]
//                   [--listen MULTIADDR] [--announce IP] [--bandwidth BYTES_PER_S]
//                   [--codec none|float16|blockwise8|...|auto] [--balance-slack PARTS]
//                   [--balance-hold-ms MS] [--max-window-kb KB]
//                   [--max-upload BYTES_PER_S] [--upload-burst BYTES] [--upload-pace F]
//                   [--aggregation mean|centered-clip] [--verify 0|1]
// --verify 1: accountability (AccountabilityConfig; bench/run-acct-overhead.sh compares).
// --upload-pace: the round paces its uploads at F x --bandwidth (AveragerConfig::upload_pace;
// 0: not paced; default: the averager's, 0.94).
// --max-upload caps this process's upload (every connection's raw TCP bytes, one token bucket,
// the host's own limiter) below the link's rate, so the sender's queue stays in the process
// instead of the link's buffer; --upload-burst is the bucket's burst (0: the host's default).
#include <algorithm>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench_cpu.hpp"
#include "net/aead.hpp"
#include "starling/averaging/averager.hpp"
#include "starling/averaging/host_address_sink.hpp"
#include "starling/averaging/wire.hpp"
#include "starling/core/log.hpp"
#include "starling/net/host.hpp"

using namespace starling;
using namespace starling::averaging;

namespace {

struct Args {
  int rank = -1, size = 0, iters = 5;
  std::string dir, listen = "/ip4/127.0.0.1/tcp/0", announce;
  std::uint64_t elems = 16u << 20;  // 64 MiB of float32
  std::size_t part_kb = 1024;
  std::uint64_t bandwidth = 1'000'000'000;
  std::string codec = "none";
  std::uint32_t max_window_kb = 0;  // 0: the yamux default
  long balance_slack = -1;          // -1: the averager's default
  long balance_hold_ms = -1;        // -1: the averager's default
  std::uint64_t max_upload = 0;     // bytes/s, 0: unlimited
  std::uint64_t upload_burst = 0;   // bytes, 0: the host's default
  double upload_pace = -1;          // fraction of --bandwidth, -1: the averager's default
  // 1: the averager has no tensors; each step hands it the flat buffers (StepData: no gather
  // or scatter copies, as the optimizer does). 0: tensors given at creation (gather/scatter).
  int flat = 1;
  std::string aggregation = "mean";
  int verify = 0;  // accountability
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--rank")
      a.rank = std::stoi(v);
    else if (k == "--size")
      a.size = std::stoi(v);
    else if (k == "--dir")
      a.dir = v;
    else if (k == "--elems")
      a.elems = std::stoull(v);
    else if (k == "--iters")
      a.iters = std::stoi(v);
    else if (k == "--part-kb")
      a.part_kb = std::stoul(v);
    else if (k == "--listen")
      a.listen = v;
    else if (k == "--announce")
      a.announce = v;
    else if (k == "--bandwidth")
      a.bandwidth = std::stoull(v);
    else if (k == "--codec")
      a.codec = v;
    else if (k == "--balance-slack")
      a.balance_slack = std::stol(v);
    else if (k == "--balance-hold-ms")
      a.balance_hold_ms = std::stol(v);
    else if (k == "--max-upload")
      a.max_upload = std::stoull(v);
    else if (k == "--upload-pace")
      a.upload_pace = std::stod(v);
    else if (k == "--upload-burst")
      a.upload_burst = std::stoull(v);
    else if (k == "--flat")
      a.flat = std::stoi(v);
    else if (k == "--aggregation")
      a.aggregation = v;
    else if (k == "--verify")
      a.verify = std::stoi(v);
    else if (k == "--max-window-kb")
      a.max_window_kb = static_cast<std::uint32_t>(std::stoul(v));
    else
      throw std::runtime_error("unknown option " + k);
  }
  if (a.rank < 0 || a.size < 1 || a.dir.empty())
    throw std::runtime_error("usage: bench_allreduce --rank R --size N --dir D [...]");
  return a;
}

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Thread CPU seconds to seal and then open `bytes` in Noise-sized frames, streaming through
// a 4 MiB buffer (not one frame kept hot in cache).
double cipher_floor_s(std::uint64_t bytes) {
  constexpr std::size_t kFrame = 65519, kTag = 16, kFrames = 64;
  std::vector<std::uint8_t> buf(kFrames * (kFrame + kTag), 7);
  std::uint8_t key[32] = {1}, nonce[12] = {0};
  const std::uint64_t frames = (bytes + kFrame - 1) / kFrame;
  bool ok = true;
  const double t0 = thread_cpu_s();
  for (std::uint64_t i = 0; i < frames; ++i) {
    std::memcpy(nonce + 4, &i, sizeof i);
    std::uint8_t* p = buf.data() + (i % kFrames) * (kFrame + kTag);
    ok = ok && net::noise::aead_seal(key, nonce, nullptr, 0, p, kFrame, p, p + kFrame) &&
         net::noise::aead_open(key, nonce, nullptr, 0, p, kFrame, p + kFrame, p);
  }
  if (!ok) throw std::runtime_error("cipher floor: seal/open failed");
  return thread_cpu_s() - t0;
}

template <class F>
auto on(asio::io_context& io, F f) {
  using T = typename decltype(f())::value_type;
  auto p = std::make_shared<std::promise<T>>();
  auto fut = p->get_future();
  asio::co_spawn(
      io, [p, f = std::move(f)]() mutable -> awaitable<void> { p->set_value(co_await f()); },
      asio::detached);
  return fut.get();
}

// Everyone puts `tag` under the key; returns once `n` values are there (or throws).
std::vector<Bytes> gather(asio::io_context& io, Directory& dir, const std::string& tag,
                          const Bytes& me, const Bytes& value, int n) {
  const Bytes key = blake2b_256(as_bytes("bench-allreduce/" + tag));
  auto put = on(
      io, [&]() { return dir.put(key, me, value, WallClock::now() + std::chrono::minutes(30)); });
  if (!put) throw std::runtime_error(put.error().message());
  const auto until = Clock::now() + std::chrono::seconds(120);
  for (;;) {
    auto got = on(io, [&]() { return dir.get(key); });
    if (got && static_cast<int>(got.value().size()) >= n) return got.value();
    if (Clock::now() > until) throw std::runtime_error("rendezvous '" + tag + "' timed out");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  std::thread th([&] { io.run(); });

  net::HostConfig hc;
  hc.listen = {a.listen};
  hc.idle_timeout = std::chrono::minutes(10);
  if (a.max_window_kb > 0) hc.yamux.max_window = a.max_window_kb * 1024;
  hc.max_upload_bytes_per_second = a.max_upload;
  hc.bandwidth_burst_bytes = a.upload_burst;
  auto host = net::Host::create(io.get_executor(), crypto::KeyPair::generate(), hc);
  auto st = on(io, [&]() { return host->start(); });
  if (!st) throw std::runtime_error(st.error().message());
  std::vector<std::string> addrs;
  for (const auto& m : host->listen_addresses()) {
    auto s = m.to_string();
    if (!a.announce.empty()) {
      // Replace the listen IP (e.g. 0.0.0.0) by the one others should dial.
      auto p = s.find("/tcp/");
      s = "/ip4/" + a.announce + s.substr(p);
    }
    addrs.push_back(s);
  }

  auto dir = std::make_shared<FileDirectory>(a.dir);
  std::vector<float> x(a.elems);
  for (std::uint64_t i = 0; i < a.elems; ++i)
    x[i] = static_cast<float>(a.rank + 1) + static_cast<float>(i % 7);
  Schema schema{{{"x", {static_cast<std::int64_t>(a.elems)}, DType::f32}}, a.codec};
  AveragerConfig cfg;
  cfg.key = {"bench", 16, 0};
  cfg.bandwidth = a.bandwidth;
  cfg.addrs = addrs;
  cfg.round.part_elems = a.part_kb * 1024 / sizeof(float);
  cfg.round.stall_timeout = std::chrono::seconds(60);
  if (a.balance_slack >= 0) cfg.round.balance_slack = static_cast<std::size_t>(a.balance_slack);
  if (a.balance_hold_ms >= 0) cfg.round.balance_hold = std::chrono::milliseconds(a.balance_hold_ms);
  if (a.upload_pace >= 0) cfg.upload_pace = a.upload_pace;
  cfg.open_timeout = std::chrono::seconds(60);
  auto agg = parse_aggregation(a.aggregation);
  if (!agg) throw std::runtime_error(agg.error().message());
  cfg.round.aggregation.kind = agg.value();
  cfg.accountability.enabled = a.verify != 0;
  auto sink = averaging::host_address_sink(host);
  std::vector<float> result_buf(a.flat ? a.elems : 0);
  std::vector<TensorView> views;
  if (!a.flat) views.push_back({"x", x});
  auto avg = Averager::create(host, dir, schema, std::move(views), cfg, sink);
  if (!avg) throw std::runtime_error(avg.error().message());
  (void)on(io, [&]() -> awaitable<result<void>> {
    avg.value()->start();
    co_return success();
  });

  // Rendezvous: everyone's member info.
  const Bytes me = copy_bytes(host->local_peer().bytes());
  MatchEntry mine;
  mine.info = avg.value()->self_info(1.0);
  mine.schema_hash = avg.value()->schema_hash();
  mine.deadline = WallClock::now() + std::chrono::minutes(30);
  auto entries = gather(io, *dir, "members", me, wire::encode_entry(mine), a.size);
  GroupInfo group;
  group.schema_hash = avg.value()->schema_hash();
  for (const auto& v : entries) {
    auto e = wire::decode_entry(v);
    if (!e) throw std::runtime_error("bad rendezvous entry");
    group.members.push_back(e.value().info);
  }
  std::sort(group.members.begin(), group.members.end(),
            [](const MemberInfo& l, const MemberInfo& r) { return l.peer < r.peer; });

  std::vector<double> times, cpu_times;
  std::uint64_t sent = 0, received = 0;
  double codec_s = 0;
  std::vector<double>
      allreduce_times;  // the round alone (with --flat 0 the step also gathers and scatters)
  double max_err = 0;
  const double want0 = (a.size + 1) / 2.0;  // mean of rank+1 over ranks
  for (int it = -1; it < a.iters; ++it) {
    for (std::uint64_t i = 0; i < a.elems; ++i)
      x[i] = static_cast<float>(a.rank + 1) + static_cast<float>(i % 7);
    gather(io, *dir, "barrier-" + std::to_string(it), me, Bytes{1}, a.size);
    group.group_id = blake2b_256(as_bytes("round-" + std::to_string(it)));
    group.group_id.resize(16);
    StepOptions so;
    so.group = group;
    so.timeout = std::chrono::seconds(300);
    const auto t0 = Clock::now();
    const double c0 = bench::process_cpu_s();
    auto r = on(io, [&]() {
      return a.flat ? avg.value()->step(so, StepData{x, result_buf, nullptr})
                    : avg.value()->step(so);
    });
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const double cpu_round = bench::process_cpu_s() - c0;
    if (!r) throw std::runtime_error("round " + std::to_string(it) + ": " + r.error().message());
    const auto& result = a.flat ? result_buf : x;
    for (std::uint64_t i = 0; i < a.elems; i += 4099)
      max_err = std::max(max_err, std::abs(result[i] - (want0 + static_cast<double>(i % 7))));
    if (it < 0) continue;  // warm-up: connections, first-touch allocations
    times.push_back(secs);
    cpu_times.push_back(cpu_round);
    allreduce_times.push_back(std::chrono::duration<double>(r.value().allreduce_time).count());
    sent += r.value().bytes_sent;
    received += r.value().bytes_received;
    codec_s += std::chrono::duration<double>(r.value().codec_time).count();
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  nlohmann::json out{{"rank", a.rank},
                     {"size", a.size},
                     {"bytes", a.elems * sizeof(float)},
                     {"times_s", times},
                     {"allreduce_times_s", allreduce_times},
                     {"median_s", sorted.empty() ? 0.0 : sorted[sorted.size() / 2]},
                     {"bytes_sent_per_round", a.iters ? sent / a.iters : 0},
                     {"bytes_received_per_round", a.iters ? received / a.iters : 0},
                     {"codec", a.codec},
                     {"flat", a.flat},
                     {"aggregation", a.aggregation},
                     {"verify", a.verify},
                     {"codec_worker_s_per_round", a.iters ? codec_s / a.iters : 0.0},
                     {"max_abs_error", max_err},
                     {"cpu_per_round_s", cpu_times}};
  {  // CPU time of all threads, and time they were runnable but waited for a CPU (load)
    double cpu = 0, wait = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream f(e.path() / "schedstat");
      double a = 0, b = 0;
      f >> a >> b;
      cpu += a / 1e9;
      wait += b / 1e9;
    }
    out["cpu_s"] = cpu;
    out["runq_wait_s"] = wait;
  }
  // Measured after the rounds (a barrier first, so no other process is mid-round).
  gather(io, *dir, "floor", me, Bytes{1}, a.size);
  if (a.size > 1)
    out["cipher_floor_s"] = cipher_floor_s(2 * (a.size - 1) * a.elems * sizeof(float) /
                                           static_cast<std::uint64_t>(a.size));
  std::cout << out.dump() << std::endl;
  // Let slower peers finish their last round before this host goes away.
  gather(io, *dir, "done", me, Bytes{1}, a.size);
  (void)on(io, [&]() -> awaitable<result<void>> {
    co_await avg.value()->stop();
    co_await host->stop();
    co_return success();
  });
  guard.reset();
  io.stop();
  th.join();
  // Values are at most 14: two 8-bit blockwise encodings (sender, owner) cost <= 2 * 14/254.
  const double tol = a.codec == "none" ? 1e-3 : 0.25;
  if (max_err >= tol) std::cerr << "bench_allreduce: error " << max_err << " above " << tol << "\n";
  return max_err < tol ? 0 : 3;
} catch (const std::exception& e) {
  std::cerr << "bench_allreduce: " << e.what() << std::endl;
  return 2;
}
