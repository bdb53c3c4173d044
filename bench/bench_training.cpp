// bench_training: collaboration efficiency of starling::Optimizer on the built-in
// Fashion-MNIST task. For k = 1, 2, 4 peers it measures the samples/s of k peers training
// together (threads of one process, each with its own io thread, over the in-process Hub
// double of the network) and, as the anchor in the same run, k peers training independently
// at the same time on the same machine (so CPU sharing cancels out). Prints both and the
// ratio, then `RESULT {json}`.
//
//   bench_training [--seconds S] [--target N] [--batch B] [--peers 1,2,4] [--delay]
//
// What it measures: the optimizer's own cost (accumulation, progress tracking, waiting for
// the group at each round, applying steps) without network transfer time; the networked
// averager's transfer cost is measured by bench_allreduce.
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "optim/fashion_peers.hpp"

using namespace starling;

namespace {

struct Measure {
  double samples_per_second = 0;
  std::uint64_t epochs = 0;
  std::uint64_t bytes_sent = 0;
};

// k peers for `seconds` (after a warm-up of one epoch); together over one hub or alone.
Measure run(const test::FashionSetup& s, int k, bool together, const optim::OptimizerOptions& o,
            double seconds) {
  auto hub = together ? std::make_shared<test::Hub>(2s) : nullptr;
  std::vector<std::unique_ptr<test::FashionPeer>> peers;
  for (int i = 0; i < k; ++i)
    peers.push_back(std::make_unique<test::FashionPeer>(s, hub, o, 0, 100 + i));
  for (auto& p : peers) p->start(UINT64_MAX);
  auto total = [&] {
    std::uint64_t n = 0;
    for (auto& p : peers) n += p->samples;
    return n;
  };
  // Warm-up: until every peer has taken a step (or 30 s).
  test::wait_for(
      [&] {
        for (auto& p : peers)
          if (p->epoch == 0) return false;
        return true;
      },
      30s);
  const auto n0 = total();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const auto n1 = total();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Measure m;
  m.samples_per_second = static_cast<double>(n1 - n0) / dt;
  for (auto& p : peers) {
    p->stop();
    m.epochs = std::max<std::uint64_t>(m.epochs, p->epoch);
    m.bytes_sent += p->bytes_sent;
  }
  for (auto& p : peers) p->join();
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 10;
  std::uint64_t target = 1024;
  std::size_t batch = 32;
  std::string peers_list = "1,2,4";
  bool delay = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--seconds")
      seconds = std::stod(next());
    else if (a == "--target")
      target = std::stoull(next());
    else if (a == "--batch")
      batch = std::stoul(next());
    else if (a == "--peers")
      peers_list = next();
    else if (a == "--delay")
      delay = true;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  auto train =
      training::load_fashion_mnist(training::kFashionMnistDefaultDir, training::Split::train);
  auto test =
      training::load_fashion_mnist(training::kFashionMnistDefaultDir, training::Split::test);
  if (!train || !test) {
    std::fprintf(stderr, "error: %s\n", (!train ? train.error() : test.error()).message().c_str());
    return 1;
  }
  torch::set_num_threads(1);
  test::FashionSetup s;
  s.train = std::move(train).value();
  s.test = std::move(test).value();
  s.batch = batch;
  auto o = test::fast_options(target, batch);
  o.delay_optimizer_step = delay;
  std::printf("bench_training: mlp, batch %zu, target %llu, %.0f s per measurement%s\n", batch,
              static_cast<unsigned long long>(target), seconds, delay ? ", delayed updates" : "");
  std::printf("%5s %16s %16s %7s %7s\n", "peers", "together samp/s", "alone samp/s", "ratio",
              "epochs");
  nlohmann::json rows = nlohmann::json::array();
  std::stringstream ss(peers_list);
  for (std::string item; std::getline(ss, item, ',');) {
    const int k = std::stoi(item);
    auto alone = run(s, k, false, o, seconds);
    auto together = run(s, k, true, o, seconds);
    const double ratio = together.samples_per_second / alone.samples_per_second;
    std::printf("%5d %16.0f %16.0f %7.3f %7llu\n", k, together.samples_per_second,
                alone.samples_per_second, ratio, static_cast<unsigned long long>(together.epochs));
    std::fflush(stdout);
    rows.push_back({{"peers", k},
                    {"together_samples_per_s", together.samples_per_second},
                    {"alone_samples_per_s", alone.samples_per_second},
                    {"ratio", ratio},
                    {"epochs", together.epochs}});
  }
  nlohmann::json result = {{"bench", "training"}, {"transport", "in-process hub"},
                           {"batch", batch},      {"target", target},
                           {"delayed", delay},    {"rows", rows}};
  std::printf("RESULT %s\n", result.dump().c_str());
  return 0;
}
