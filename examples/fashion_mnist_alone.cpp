// Trains the built-in Fashion-MNIST task in one process, without any network, and prints
// throughput (samples/s) and test accuracy against samples seen. This is the baseline a
// collaboration is compared with (same model, same batch size, same samples).
//
//   example_fashion_mnist_alone [--model mlp|cnn] [--batch N] [--lr X] [--threads T]
//                               [--max-samples N] [--eval-every N] [--target-accuracy A]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <torch/optim/adam.h>
#include <torch/utils.h>

#include "starling/optim/fashion_task.hpp"

using namespace starling;

namespace {
// CPU seconds used by this process so far (user + system, all threads): on a shared machine
// this is a steadier measure of cost than wall time.
double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}
}  // namespace

int main(int argc, char** argv) {
  std::string model = "mlp", data_dir = training::kFashionMnistDefaultDir;
  std::size_t batch = 64, max_samples = 300000, eval_every = 10000;
  double lr = 1e-3, target = 0.85;
  int threads = 1;
  std::uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      model = v;
    else if (k == "--batch")
      batch = std::stoul(v);
    else if (k == "--lr")
      lr = std::stod(v);
    else if (k == "--threads")
      threads = std::stoi(v);
    else if (k == "--max-samples")
      max_samples = std::stoul(v);
    else if (k == "--eval-every")
      eval_every = std::stoul(v);
    else if (k == "--target-accuracy")
      target = std::stod(v);
    else if (k == "--seed")
      seed = std::stoull(v);
    else if (k == "--data-dir")
      data_dir = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  torch::set_num_threads(threads);
  auto kind = optim::parse_fashion_model(model);
  auto train = training::load_fashion_mnist(data_dir, training::Split::train);
  auto test = training::load_fashion_mnist(data_dir, training::Split::test);
  if (!kind || !train || !test) {
    std::fprintf(stderr, "error: %s\n",
                 (!kind    ? kind.error()
                  : !train ? train.error()
                           : test.error())
                     .message()
                     .c_str());
    return 1;
  }
  optim::FashionTask task(train.value(), kind.value(), 0, seed);
  optim::FashionData test_data(test.value());
  torch::optim::Adam adam(task.model()->parameters(), torch::optim::AdamOptions(lr));
  std::printf("model=%s batch=%zu lr=%g threads=%d params=%lld\n", model.c_str(), batch, lr,
              threads, static_cast<long long>([&] {
                std::int64_t n = 0;
                for (auto& p : task.model()->parameters()) n += p.numel();
                return n;
              }()));
  std::printf("%10s %10s %9s %10s %11s %9s %10s\n", "samples", "train_s", "samples/s",
              "train_cpu_s", "samples/cpu_s", "test_acc", "test_loss");
  using clk = std::chrono::steady_clock;
  double train_seconds = 0, train_cpu = 0;
  std::size_t seen = 0, next_eval = eval_every;
  double time_to_target = -1;
  while (seen < max_samples) {
    auto t0 = clk::now();
    double c0 = cpu_seconds();
    adam.zero_grad();
    task.forward_backward(batch);
    adam.step();
    train_seconds += std::chrono::duration<double>(clk::now() - t0).count();
    train_cpu += cpu_seconds() - c0;
    seen += batch;
    if (seen >= next_eval) {
      next_eval += eval_every;
      auto ev = optim::evaluate(task.model(), test_data);
      std::printf("%10zu %10.2f %9.0f %10.2f %11.0f %9.4f %10.4f\n", seen, train_seconds,
                  seen / train_seconds, train_cpu, seen / train_cpu, ev.accuracy, ev.loss);
      std::fflush(stdout);
      if (ev.accuracy >= target && time_to_target < 0) {
        time_to_target = train_seconds;
        std::printf("reached %.2f after %zu samples, %.2f s (%.2f cpu s) of training\n", target,
                    seen, train_seconds, train_cpu);
        break;
      }
    }
  }
  return time_to_target >= 0 ? 0 : 3;
}
