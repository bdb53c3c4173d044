// bench_moe_stream: a large expert call streamed (stream.hpp: chunks of 2 MiB as successive
// frames) beside the same call sent as one message (the anchor), in the same run. The expert
// is elementwise on [N, 4096, 16] rows (compute is negligible: the figure is the wire's), on
// an ExpertServer on its own Host; the client is a RemoteExpert on a second Host; forward +
// backward of `rows` rows (default 96: a 24 MiB input, the largest whose backward request,
// input and gradient, fits the 64 MiB one-message limit).
//   throughput: MB/s of tensor payload (forward request and answer, backward request and
//               answer), the two forms interleaved call by call, median of `reps` each;
//   peak memory: the rise of the process's peak RSS over one forward + backward, each form in
//               a fresh child process (this binary with --memory-child), server and client
//               together.
// Prints both figures and the ratios, then `RESULT {json}`.
//
//   bench_moe_stream [--reps 7] [--rows 96]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "bench_host.hpp"
#include "starling/core/blocking.hpp"
#include "starling/moe/expert_server.hpp"
#include "starling/moe/remote.hpp"

using namespace starling;
using namespace starling::moe;

namespace {

constexpr std::int64_t kRowValues = 4096 * 16;

struct Scale : torch::nn::Module {
  torch::Tensor w;
  Scale() { w = register_parameter("w", torch::ones({16})); }
};

ExpertModule scale_expert() {
  auto m = std::make_shared<Scale>();
  ExpertModule e;
  e.forward = [m](const torch::Tensor& x) { return x * m->w; };
  e.parameters = m;
  e.input_shape = {4096, 16};
  e.output_shape = {4096, 16};
  e.type = "scale";
  return e;
}

// "VmRSS" / "VmHWM" of this process, in MiB.
double proc_status_mb(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return std::atof(line.c_str() + field.size() + 1) / 1024;
  return 0;
}

struct Rig {
  IoThread sio{"bench-stream-server-io"};
  IoThread cio{"bench-stream-client-io"};
  std::shared_ptr<net::Host> server_host = bench::start_host_or_exit(sio);
  std::shared_ptr<net::Host> client_host = bench::start_host_or_exit(cio);
  std::shared_ptr<ExpertServer> server;

  Rig() {
    ExpertServerConfig cfg;
    cfg.backward_pool.max_wait = cfg.forward_pool.max_wait = 0ms;
    server = ExpertServer::create(server_host, nullptr, cfg);
    if (!server->add_expert("ffn.0", scale_expert(), sgd_factory(1e-9))) std::exit(1);
    if (!block_on(
            sio.executor(), [this] { return server->start(); }, 10s))
      std::exit(1);
  }
  ~Rig() {
    (void)block_on(
        sio.executor(),
        [this]() -> awaitable<result<void>> {
          co_await server->stop();
          co_await server_host->stop();
          co_return success();
        },
        30s);
    (void)block_on(
        cio.executor(),
        [this]() -> awaitable<result<void>> {
          co_await client_host->stop();
          co_return success();
        },
        30s);
    (void)sio.stop();
    (void)cio.stop();
  }
  RemoteExpert expert(bool streamed) {
    ExpertCallOptions o;
    o.timeout = 120s;
    if (!streamed) o.stream_threshold = std::numeric_limits<std::uint64_t>::max();
    return RemoteExpert(
        client_host,
        ExpertAddress{"ffn.0", server_host->local_peer(), server_host->listen_addresses()}, o);
  }
};

void step(RemoteExpert& e, const torch::Tensor& x, const torch::Tensor& g) {
  auto xi = x.clone().requires_grad_(true);
  e.forward(xi).backward(g);
}

// Child: one forward + backward in the given form; prints the peak RSS rise (MiB).
int memory_child(bool streamed, std::int64_t rows) {
  torch::set_num_threads(1);
  Rig rig;
  auto e = rig.expert(streamed);
  if (!e.info()) return 1;
  auto x = torch::randn({rows, 4096, 16});
  auto g = torch::randn({rows, 4096, 16});
  const double base = proc_status_mb("VmRSS");
  try {
    step(e, x, g);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "%s\n", ex.what());
    return 1;
  }
  std::printf("%.1f\n", proc_status_mb("VmHWM") - base);
  return 0;
}

double child_peak(const char* self, bool streamed, std::int64_t rows) {
  const std::string cmd = std::string(self) + " --memory-child " + (streamed ? "stream" : "one") +
                          " --rows " + std::to_string(rows);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  double mb = -1;
  if (std::fscanf(p, "%lf", &mb) != 1) mb = -1;
  return pclose(p) == 0 ? mb : -1;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7;
  std::int64_t rows = 96;
  std::string child;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
    if (a == "--rows") rows = std::atoll(argv[i + 1]);
    if (a == "--memory-child") child = argv[i + 1];
  }
  if (!child.empty()) return memory_child(child == "stream", rows);

  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  const double peak_stream = child_peak(self.c_str(), true, rows);
  const double peak_one = child_peak(self.c_str(), false, rows);

  torch::set_num_threads(1);
  Rig rig;
  auto streamed = rig.expert(true);
  auto one = rig.expert(false);
  if (!streamed.info() || !one.info()) return 1;
  auto x = torch::randn({rows, 4096, 16});
  auto g = torch::randn({rows, 4096, 16});
  const double tensor_mb = static_cast<double>(rows * kRowValues) * 4 / (1 << 20);
  const double payload_mb = 5 * tensor_mb;  // fwd: in + out; bwd: in + grad + grad_in
  step(streamed, x, g);                     // warm up both
  step(one, x, g);
  std::vector<double> ts, to;
  for (int i = 0; i < reps; ++i) {
    for (bool s : {true, false}) {
      const auto t0 = std::chrono::steady_clock::now();
      step(s ? streamed : one, x, g);
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      (s ? ts : to).push_back(sec);
    }
  }
  std::sort(ts.begin(), ts.end());
  std::sort(to.begin(), to.end());
  const double mbps_s = payload_mb / ts[ts.size() / 2];
  const double mbps_o = payload_mb / to[to.size() / 2];
  const auto streamed_calls = rig.server->stats().streamed_calls.load();
  std::printf(
      "forward+backward of [%lld, 4096, 16] (%.0f MiB a tensor, %.0f MiB of payload a step), "
      "median of %d:\n"
      "  streamed (2 MiB chunks): %.0f MiB/s | one message: %.0f MiB/s | ratio %.2f "
      "(%llu streamed calls)\n"
      "  peak RSS rise over one step: streamed %.0f MiB | one message %.0f MiB | ratio %.2f\n",
      static_cast<long long>(rows), tensor_mb, payload_mb, reps, mbps_s, mbps_o, mbps_s / mbps_o,
      static_cast<unsigned long long>(streamed_calls), peak_stream, peak_one,
      peak_one > 0 ? peak_stream / peak_one : 0.0);
  nlohmann::json out{{"rows", rows},
                     {"tensor_mib", tensor_mb},
                     {"streamed_mib_per_s", mbps_s},
                     {"one_message_mib_per_s", mbps_o},
                     {"throughput_ratio", mbps_s / mbps_o},
                     {"peak_rss_rise_streamed_mib", peak_stream},
                     {"peak_rss_rise_one_message_mib", peak_one}};
  std::printf("RESULT %s\n", out.dump().c_str());
  return 0;
}
