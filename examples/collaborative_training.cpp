// A user's own libtorch training loop made collaborative with starling::Optimizer.
//
// The model and the loop are ordinary libtorch; the collaborative part is three things:
//   1. a TrainingNode (io thread + libp2p host + DHT node + collaboration) that joins the
//      network through an initial peer (a `starling dht` node or any other peer);
//   2. starling::Optimizer wrapping the torch optimizer, given the node's collaboration;
//   3. opt->step(batch_size) instead of adam.step().
// Every peer runs this same program; together they take one optimizer step per
// `--target-batch` samples accumulated by all of them, and hold identical parameters.
//
//   starling dht --listen /ip4/127.0.0.1/tcp/4001          # prints its multiaddr
//   example_collaborative_training --initial-peers /ip4/127.0.0.1/tcp/4001/p2p/12D3...
//   example_collaborative_training --initial-peers ...     # as many peers as you like
//
// Flags: --initial-peers ADDR (repeatable; none: train alone), --run-id ID, --epochs N,
// --target-batch N, --batch N, --data-dir DIR. Prints one line per epoch and, at the end,
// `done epoch E accuracy A samples S bytes_sent B param_hash H`.
#include <cstdio>
#include <string>
#include <vector>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include "starling/collab/training_node.hpp"
#include "starling/optim/fashion_task.hpp"
#include "starling/optim/optimizer.hpp"

namespace {

// The user's own model: nothing Starling-specific.
struct Net : torch::nn::Module {
  Net()
      : fc1(register_module("fc1", torch::nn::Linear(784, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    return fc2->forward(torch::relu(fc1->forward(x.flatten(1))));
  }
  torch::nn::Linear fc1, fc2;
};

// FNV-1a over every parameter's bytes: equal on peers that hold identical parameters.
std::string parameter_hash(torch::nn::Module& m) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& p : m.parameters()) {
    auto c = p.detach().contiguous().cpu();
    const auto* b = static_cast<const unsigned char*>(c.data_ptr());
    for (std::size_t i = 0; i < c.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "error: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace starling;
  std::vector<std::string> initial_peers;
  std::string run_id = "example", data_dir = training::kFashionMnistDefaultDir;
  std::uint64_t epochs = 30, target_batch = 2048;
  std::size_t batch = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--initial-peers")
      initial_peers.push_back(v);
    else if (k == "--run-id")
      run_id = v;
    else if (k == "--epochs")
      epochs = std::stoull(v);
    else if (k == "--target-batch")
      target_batch = std::stoull(v);
    else if (k == "--batch")
      batch = std::stoul(v);
    else if (k == "--data-dir")
      data_dir = v;
    else
      return fail("unknown flag " + k);
  }
  torch::set_num_threads(1);
  auto train = training::load_fashion_mnist(data_dir, training::Split::train);
  if (!train) return fail(train.error().message());
  auto test = training::load_fashion_mnist(data_dir, training::Split::test);
  if (!test) return fail(test.error().message());
  const optim::FashionData train_data(train.value()), test_data(test.value());

  // 1. The node. Without initial peers this peer trains alone (no network).
  std::unique_ptr<collab::TrainingNode> node;
  if (!initial_peers.empty()) {
    collab::TrainingNodeConfig cfg;
    cfg.collab.run_id = run_id;
    for (const auto& s : initial_peers) {
      auto a = net::Multiaddr::parse(s);
      if (!a) return fail("--initial-peers " + s + ": " + a.error().message());
      cfg.initial_peers.push_back(a.value());
    }
    auto n = collab::TrainingNode::start(crypto::KeyPair::generate(), cfg);
    if (!n) return fail("joining: " + n.error().message());
    node = std::move(n).value();
  }

  // Every peer builds the model from the same seed, so all start from the same parameters
  // (a peer that joins a run already in progress downloads the current ones instead).
  torch::manual_seed(0);
  auto model = std::make_shared<Net>();

  // 2. The optimizer: any torch optimizer, wrapped.
  OptimizerOptions o;
  o.run_id = run_id;
  o.target_batch_size = target_batch;
  o.matchmaking_time = 2s;
  o.averaging_timeout = 15s;
  auto opt =
      Optimizer::create(*model, std::make_unique<torch::optim::Adam>(model->parameters(), 1e-3), o,
                        node ? node->collaboration() : nullptr);
  if (!opt) return fail(opt.error().message());

  // The user's loop: each peer reads its own shuffled stream of the training set.
  training::SampleStream stream(
      train_data.size(),
      training::seed_from_bytes(as_bytes(node ? node->peer().to_string() : std::string("alone"))));
  std::vector<std::uint32_t> idx;
  while (opt.value()->local_epoch() < epochs) {
    idx.clear();
    stream.next(batch, idx);
    auto [x, y] = train_data.batch(idx);
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    // 3. Instead of adam.step(): accumulate, and step together when the group is ready.
    auto r = opt.value()->step(batch);
    if (!r) return fail(r.error().message());
    if (r.value().stepped)
      std::printf("epoch %llu loss %.4f group %zu\n",
                  static_cast<unsigned long long>(r.value().epoch), loss.item<double>(),
                  r.value().group_size);
    std::fflush(stdout);
  }

  torch::NoGradGuard no_grad;
  auto [tx, ty] = test_data.range(0, test_data.size());
  const double accuracy =
      model->forward(tx).argmax(1).eq(ty).to(torch::kDouble).mean().item<double>();
  const auto st = opt.value()->status();
  std::printf("done epoch %llu accuracy %.4f samples %llu bytes_sent %llu param_hash %s\n",
              static_cast<unsigned long long>(st.local_epoch), accuracy,
              static_cast<unsigned long long>(st.samples_total),
              static_cast<unsigned long long>(st.bytes_sent), parameter_hash(*model).c_str());
  std::fflush(stdout);
  if (auto r = opt.value()->shutdown(); !r) return fail("leaving: " + r.error().message());
  if (node)
    if (auto r = node->stop(); !r) return fail("stopping the node: " + r.error().message());
  return 0;
}
