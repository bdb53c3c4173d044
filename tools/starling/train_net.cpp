// The networked side of `starling train`: identity, node, directory and the collaboration.
#include <iostream>

#include "cli.hpp"
#include "starling/crypto/keys.hpp"
#include "starling/net/peer_id.hpp"
#include "train_options.hpp"

namespace starling::cli {
namespace {

// A peer that trains alone: no node, no collaboration.
class AloneNetwork final : public TrainNetwork {
 public:
  explicit AloneNetwork(std::string peer) : peer_(std::move(peer)) {}
  std::shared_ptr<optim::Collaboration> collaboration() override { return nullptr; }
  std::string peer_id() const override { return peer_; }
  void stop() override {}

 private:
  std::string peer_;
};

}  // namespace

result<std::unique_ptr<TrainNetwork>> start_train_network(const TrainOptions& o) {
  auto key = load_identity_or_exit(o.identity, true);
  const auto peer = net::PeerId::from_public_key(key.public_key()).to_string();
  if (o.directory.empty() && o.initial_peers.empty())
    return std::unique_ptr<TrainNetwork>(std::make_unique<AloneNetwork>(peer));
  return make_error(errc::unavailable, "networked training is not built yet");
}

}  // namespace starling::cli
