// Codec benchmark: encode / decode / decode-accumulate throughput (GB/s of float32 input, one
// core and the whole ThreadPool) and error (max abs, RMSE relative to the input RMS) of every
// codec on normal(0, 1) data, next to a memcpy of the same bytes as the anchor.
//
//   bench_codecs [--mb 64] [--reps 5] [--threads N] [--codecs none,float16,...]
//
// Prints a table and ends with one line `RESULT {json}`. Medians over --reps runs.
// Single-core throughput is measured in thread CPU time (see median_seconds).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_cpu.hpp"

#include "starling/averaging/compression.hpp"
#include "starling/core/thread_pool.hpp"

using namespace starling;
using namespace starling::averaging;

namespace {

double now(clockid_t clock) {
  return bench::clock_s(clock);
}

// Median over `reps` runs of f's duration on `clock`. Single-threaded runs are timed with the
// thread's CPU clock: on a shared, overloaded machine wall time mostly measures waiting for
// a core, while CPU time is what the codec costs per core. Pool runs use wall time.
template <class F>
double median_seconds(int reps, clockid_t clock, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    double t0 = now(clock);
    f();
    t.push_back(now(clock) - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
constexpr clockid_t kCpu = CLOCK_THREAD_CPUTIME_ID;
constexpr clockid_t kWall = CLOCK_MONOTONIC;

void die(const std::string& what) {
  std::fprintf(stderr, "bench_codecs: %s\n", what.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mb = 64;
  int reps = 5;
  std::size_t threads = ThreadPool::default_threads();
  std::vector<CodecId> codecs = {CodecId::none,      CodecId::float16,   CodecId::bfloat16,
                                 CodecId::uniform8,  CodecId::quantile8, CodecId::blockwise8,
                                 CodecId::blockwise4};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value for " + a);
      return argv[++i];
    };
    if (a == "--mb") {
      mb = std::stoul(next());
    } else if (a == "--reps") {
      reps = std::max(1, std::stoi(next()));
    } else if (a == "--threads") {
      threads = std::max<std::size_t>(1, std::stoul(next()));
    } else if (a == "--codecs") {
      codecs.clear();
      std::string list = next();
      std::size_t pos = 0;
      while (pos <= list.size()) {
        std::size_t end = list.find(',', pos);
        if (end == std::string::npos) end = list.size();
        auto c = codec_from_string(list.substr(pos, end - pos));
        if (!c) die("unknown codec " + list.substr(pos, end - pos));
        codecs.push_back(*c);
        pos = end + 1;
      }
    } else {
      die("unknown argument " + a);
    }
  }

  std::size_t n = mb * (std::size_t{1} << 20) / sizeof(float);
  double gb = static_cast<double>(n * sizeof(float)) / 1e9;
  std::vector<float> x(n), y(n), acc(n);
  {
    std::mt19937 g(12345);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : x) v = d(g);
  }
  double rms = 0;
  for (float v : x) rms += static_cast<double>(v) * v;
  rms = std::sqrt(rms / static_cast<double>(n));

  ThreadPool pool(threads);
  double memcpy_s = median_seconds(reps, kCpu, [&] { std::memcpy(y.data(), x.data(), n * 4); });
  double memcpy_gbs = gb / memcpy_s;
  double memcpy_mt_s = median_seconds(reps, kWall, [&] {
    pool.parallel_for(0, n, std::size_t{1} << 18, [&](std::size_t lo, std::size_t hi) {
      std::memcpy(y.data() + lo, x.data() + lo, (hi - lo) * 4);
    });
  });
  double memcpy_mt_gbs = gb / memcpy_mt_s;

  std::printf("codec benchmark: %zu MiB of normal(0,1) float32, median of %d, %zu pool threads\n",
              mb, reps, threads);
  std::printf("single-core figures use thread CPU time; pool (MT) figures use wall time\n");
  std::printf("anchor memcpy: %.2f GB/s (1 core), %.2f GB/s (pool, wall)\n\n", memcpy_gbs,
              memcpy_mt_gbs);
  std::printf("%-11s %6s | %8s %8s %8s | %6s %6s | %8s %8s | %10s %10s\n", "codec", "ratio",
              "enc GB/s", "dec GB/s", "acc GB/s", "enc/mc", "dec/mc", "enc MT", "dec MT", "max abs",
              "rel RMSE");

  nlohmann::json rows = nlohmann::json::array();
  for (CodecId c : codecs) {
    CodecSpec spec{c};
    Bytes buf(encoded_size(spec, n));
    EncodeOptions eo;
    DecodeOptions dopt;
    auto run_enc = [&] {
      if (auto r = encode_into(spec, x, buf, eo); !r) die(r.error().message());
    };
    auto run_dec = [&] {
      if (auto r = decode(buf, y, dopt); !r) die(r.error().message());
    };
    double enc_s = median_seconds(reps, kCpu, run_enc);
    double dec_s = median_seconds(reps, kCpu, run_dec);
    std::fill(acc.begin(), acc.end(), 0.0f);
    double acc_s = median_seconds(reps, kCpu, [&] {
      if (auto r = decode_accumulate(buf, acc, 0.5f, dopt); !r) die(r.error().message());
    });
    eo.pool = &pool;
    dopt.pool = &pool;
    double enc_mt_s = median_seconds(reps, kWall, run_enc);
    double dec_mt_s = median_seconds(reps, kWall, run_dec);

    run_dec();
    double max_abs = 0, se = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double e = std::fabs(static_cast<double>(y[i]) - x[i]);
      max_abs = std::max(max_abs, e);
      se += e * e;
    }
    double rel_rmse = std::sqrt(se / static_cast<double>(n)) / rms;
    double ratio = static_cast<double>(n * 4) / static_cast<double>(buf.size());
    std::printf("%-11s %6.2f | %8.2f %8.2f %8.2f | %6.2f %6.2f | %8.2f %8.2f | %10.3g %10.3g\n",
                std::string(to_string(c)).c_str(), ratio, gb / enc_s, gb / dec_s, gb / acc_s,
                (gb / enc_s) / memcpy_gbs, (gb / dec_s) / memcpy_gbs, gb / enc_mt_s, gb / dec_mt_s,
                max_abs, rel_rmse);
    rows.push_back({{"codec", to_string(c)},
                    {"block", spec.block_size()},
                    {"compression_ratio", ratio},
                    {"encode_gbps", gb / enc_s},
                    {"decode_gbps", gb / dec_s},
                    {"accumulate_gbps", gb / acc_s},
                    {"encode_vs_memcpy", (gb / enc_s) / memcpy_gbs},
                    {"decode_vs_memcpy", (gb / dec_s) / memcpy_gbs},
                    {"encode_mt_gbps", gb / enc_mt_s},
                    {"decode_mt_gbps", gb / dec_mt_s},
                    {"max_abs_error", max_abs},
                    {"rel_rmse", rel_rmse}});
  }
  nlohmann::json result = {{"bench", "codecs"},
                           {"mib", mb},
                           {"reps", reps},
                           {"threads", threads},
                           {"single_core_clock", "thread_cpu_time"},
                           {"pool_clock", "wall"},
                           {"memcpy_gbps", memcpy_gbs},
                           {"memcpy_mt_gbps", memcpy_mt_gbs},
                           {"codecs", rows}};
  std::printf("\nRESULT %s\n", result.dump().c_str());
  return 0;
}
