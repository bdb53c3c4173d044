// ban_gate (ban_gate.hpp).
#include "starling/averaging/ban_gate.hpp"

namespace starling::averaging {

namespace {

class BanGate final : public PeerGate {
 public:
  BanGate(std::shared_ptr<const acct::BanList> bans, std::shared_ptr<PeerGate> inner)
      : bans_(std::move(bans)), inner_(std::move(inner)) {}
  bool admits(const net::PeerId& peer) override {
    return !banned(peer) && (!inner_ || inner_->admits(peer));
  }
  awaitable<bool> admit(const net::PeerId& peer) override {
    if (banned(peer)) co_return false;
    if (!inner_) co_return true;
    co_return co_await inner_->admit(peer);
  }

 private:
  bool banned(const net::PeerId& peer) const {
    auto k = acct::key_of_peer(peer);
    return k && bans_->banned(*k);
  }
  std::shared_ptr<const acct::BanList> bans_;
  std::shared_ptr<PeerGate> inner_;
};

}  // namespace

std::shared_ptr<PeerGate> ban_gate(std::shared_ptr<const acct::BanList> bans,
                                   std::shared_ptr<PeerGate> inner) {
  if (!bans) return inner;
  return std::make_shared<BanGate>(std::move(bans), std::move(inner));
}

}  // namespace starling::averaging
