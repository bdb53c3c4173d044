// bench_state_format: serialise + parse time and size of the training state of the built-in
// task's models (`starling train`: MLP and CNN, Adam after a few steps) in Starling's state
// format (save_training_state / load_training_state, and the torch-free decode alone), beside
// the torch archive that Starling used before (OutputArchive of the model and optimizer, then
// InputArchive + Module::load + Optimizer::load) as the anchor, in the same run. Prints both
// and the ratios, then `RESULT {json}`.
//
//   bench_state_format [--reps N]
//
// Times are medians of N runs in thread CPU time (the machine is shared; CPU time is what the
// work costs), with torch limited to one thread; wall medians are printed too.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <nlohmann/json.hpp>

#include "bench_cpu.hpp"

#include "starling/optim/fashion_task.hpp"
#include "starling/optim/training_state.hpp"
#include "starling/training/state_format.hpp"

using namespace starling;
using namespace starling::optim;
using namespace starling::training;

namespace {

double now(clockid_t clock) {
  return bench::clock_s(clock);
}

struct Time {
  double cpu_ms = 0, wall_ms = 0;
};

template <class F>
Time median(int reps, F&& f) {
  std::vector<double> cpu, wall;
  for (int r = 0; r < reps; ++r) {
    const double c0 = now(CLOCK_THREAD_CPUTIME_ID), w0 = now(CLOCK_MONOTONIC);
    f();
    cpu.push_back(1e3 * (now(CLOCK_THREAD_CPUTIME_ID) - c0));
    wall.push_back(1e3 * (now(CLOCK_MONOTONIC) - w0));
  }
  std::sort(cpu.begin(), cpu.end());
  std::sort(wall.begin(), wall.end());
  return {cpu[cpu.size() / 2], wall[wall.size() / 2]};
}

void die(const std::string& what) {
  std::fprintf(stderr, "bench_state_format: %s\n", what.c_str());
  std::exit(1);
}

// The torch archive serialisation (model and optimizer archives): the anchor.
std::string torch_save(const torch::nn::Module& m, const torch::optim::Optimizer& o) {
  torch::serialize::OutputArchive root;
  torch::serialize::OutputArchive model_ar(root.compilation_unit()),
      opt_ar(root.compilation_unit());
  m.save(model_ar);
  root.write("model", model_ar);
  o.save(opt_ar);
  root.write("optimizer", opt_ar);
  std::ostringstream out;
  root.save_to(out);
  return out.str();
}

void torch_load(const std::string& bytes, torch::nn::Module& m, torch::optim::Optimizer& o) {
  torch::serialize::InputArchive root, model_ar, opt_ar;
  root.load_from(bytes.data(), bytes.size());
  root.read("model", model_ar);
  root.read("optimizer", opt_ar);
  m.load(model_ar);
  o.load(opt_ar);
}

struct Row {
  std::string model;
  std::size_t params = 0, bytes = 0, torch_bytes = 0;
  Time save, load, decode, torch_save, torch_load;
};

Row measure(FashionModel kind, int reps) {
  Row row;
  row.model = to_string(kind);
  auto a = make_fashion_model(kind, 1);
  torch::optim::Adam adam_a(a->parameters(), torch::optim::AdamOptions(1e-3));
  for (int i = 0; i < 3; ++i) {  // non-zero moments and a step count, as in a running peer
    torch::manual_seed(i);
    adam_a.zero_grad();
    torch::nn::functional::cross_entropy(a->forward(torch::randn({16, 1, 28, 28})),
                                         torch::randint(0, 10, {16}))
        .backward();
    adam_a.step();
  }
  for (const auto& p : a->parameters()) row.params += static_cast<std::size_t>(p.numel());
  auto b = make_fashion_model(kind, 2);
  torch::optim::Adam adam_b(b->parameters(), torch::optim::AdamOptions(1e-3));

  Bytes state;
  row.save = median(reps, [&] { state = save_training_state(*a, &adam_a).value(); });
  row.bytes = state.size();
  row.decode = median(reps, [&] {
    if (!state_format::decode(state)) die("decode failed");
  });
  row.load = median(reps, [&] {
    if (auto r = load_training_state(state, *b, &adam_b); !r) die(r.error().message());
  });
  if (save_training_state(*b, &adam_b).value() != state) die("the loaded state differs");

  std::string archive;
  row.torch_save = median(reps, [&] { archive = torch_save(*a, adam_a); });
  row.torch_bytes = archive.size();
  row.torch_load = median(reps, [&] { torch_load(archive, *b, adam_b); });
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 21;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else
      die("usage: bench_state_format [--reps N]");
  }
  torch::set_num_threads(1);
  std::printf("training state (model + Adam), medians of %d runs, thread CPU ms (wall ms)\n", reps);
  std::printf("%-4s %8s | %10s %10s %6s | %15s %15s %6s | %15s %15s %6s | %13s\n", "", "params",
              "bytes", "torch", "ratio", "save", "torch save", "ratio", "load", "torch load",
              "ratio", "decode alone");
  nlohmann::json rows = nlohmann::json::array();
  for (auto kind : {FashionModel::mlp, FashionModel::cnn}) {
    const Row r = measure(kind, reps);
    auto t = [](const Time& x) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3f (%.3f)", x.cpu_ms, x.wall_ms);
      return std::string(buf);
    };
    const double size_ratio = static_cast<double>(r.torch_bytes) / static_cast<double>(r.bytes);
    const double save_ratio = r.torch_save.cpu_ms / r.save.cpu_ms;
    const double load_ratio = r.torch_load.cpu_ms / r.load.cpu_ms;
    std::printf("%-4s %8zu | %10zu %10zu %6.3f | %15s %15s %6.2f | %15s %15s %6.2f | %13s\n",
                r.model.c_str(), r.params, r.bytes, r.torch_bytes, size_ratio, t(r.save).c_str(),
                t(r.torch_save).c_str(), save_ratio, t(r.load).c_str(), t(r.torch_load).c_str(),
                load_ratio, t(r.decode).c_str());
    rows.push_back({{"model", r.model},
                    {"params", r.params},
                    {"bytes", r.bytes},
                    {"torch_bytes", r.torch_bytes},
                    {"save_cpu_ms", r.save.cpu_ms},
                    {"torch_save_cpu_ms", r.torch_save.cpu_ms},
                    {"load_cpu_ms", r.load.cpu_ms},
                    {"torch_load_cpu_ms", r.torch_load.cpu_ms},
                    {"decode_cpu_ms", r.decode.cpu_ms},
                    {"size_ratio_torch_over_starling", size_ratio},
                    {"save_speedup", save_ratio},
                    {"load_speedup", load_ratio}});
  }
  std::printf(
      "ratios: torch archive / Starling format (> 1: Starling smaller or faster). load "
      "= parse + all checks + apply; torch load = parse + apply, no checks\n");
  std::printf("RESULT %s\n",
              nlohmann::json{{"bench", "state_format"}, {"rows", rows}}.dump().c_str());
  return 0;
}
