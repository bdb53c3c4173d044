// The networked side of `starling train`: identity, io thread, Host, DHT node and the
// NetCollaboration (collab/training_node.hpp).
#include <iostream>
#include <optional>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "cli.hpp"
#include "starling/averaging/averager.hpp"
#include "starling/collab/training_node.hpp"
#include "starling/core/blocking.hpp"
#include "starling/crypto/keys.hpp"
#include "starling/monitor/metrics_dht.hpp"
#include "starling/net/multiaddr.hpp"
#include "starling/net/peer_id.hpp"
#include "train_options.hpp"

namespace starling::cli {
namespace {

// A peer that trains alone: no node, no collaboration.
class AloneNetwork final : public TrainNetwork {
 public:
  explicit AloneNetwork(std::string peer) : peer_(std::move(peer)) {}
  std::shared_ptr<training::Collaboration> collaboration() override { return nullptr; }
  std::string peer_id() const override { return peer_; }
  void stop() override {}

 private:
  std::string peer_;
};

// Stops a metrics publisher on its node's executor (a function object: GCC 12 and lambdas in
// coroutines).
struct StopPublisher {
  std::shared_ptr<monitor::MetricsPublisher> publisher;
  awaitable<result<void>> operator()() const {
    co_await publisher->stop(3s);
    co_return success();
  }
};

// Reads the run's metrics records on the node's executor (a private run: members' only).
struct ReadRecords {
  std::shared_ptr<dht::DhtNode> node;
  dht::RecordKey key;
  std::shared_ptr<averaging::PeerGate> gate;
  awaitable<result<std::vector<monitor::MetricsEntry>>> operator()() const {
    ST_CO_TRY(auto all, co_await monitor::read_metrics(node, key));
    if (!gate) co_return all;
    std::vector<monitor::MetricsEntry> members;
    for (auto& e : all) {
      const bool admitted = co_await gate->admit(e.peer);
      if (admitted) members.push_back(std::move(e));
    }
    co_return members;
  }
};

class DhtNetwork final : public TrainNetwork {
 public:
  DhtNetwork(std::unique_ptr<collab::TrainingNode> node, const TrainOptions& o)
      : node_(std::move(node)), run_id_(o.run_id) {
    if (!metrics_enabled(o)) return;
    monitor::PublisherConfig pc;
    pc.run_id = o.run_id;
    const double every = std::max(0.1, o.metrics_interval);
    pc.interval = seconds(every);
    pc.ttl = seconds(std::max(60.0, 6 * every));
    publisher_ = monitor::MetricsPublisher::create(node_->dht(), pc);
  }
  std::shared_ptr<training::Collaboration> collaboration() override {
    return node_->collaboration();
  }
  std::string peer_id() const override { return node_->peer().to_string(); }
  std::shared_ptr<net::Host> host() override { return node_->host(); }
  std::shared_ptr<dht::DhtNode> dht() override { return node_->dht(); }
  void publish_metrics(monitor::MetricsRecord r) override {
    if (publisher_) publisher_->submit(std::move(r));
  }
  void stop() override {
    if (publisher_) {
      auto stopped = block_on(node_->executor(), StopPublisher{publisher_}, 5s);
      if (!stopped) std::cerr << "warning: metrics: " << stopped.error().message() << "\n";
      publisher_.reset();
    }
    if (auto r = node_->stop(15s); !r)
      std::cerr << "warning: leaving the network: " << r.error().message() << "\n";
  }
  std::pair<std::uint64_t, std::uint64_t> traffic() override { return node_->traffic(); }
  result<void> check_run_identity(const std::string& identity, double own_uptime_s) override {
    ReadRecords r{node_->dht(), monitor::metrics_key(run_id_),
                  node_->collaboration()->membership()};
    auto read = block_on(node_->executor(), r, 15s);
    if (!read) return read.error().with_context("reading the run's metrics records");
    return cli::check_run_identity(read.value(), node_->peer(), run_id_, identity, own_uptime_s);
  }
  std::vector<std::string> addresses() const override {
    std::vector<std::string> out;
    for (const auto& a : node_->listen_addresses()) out.push_back(a.to_string());
    return out;
  }

 private:
  std::unique_ptr<collab::TrainingNode> node_;
  std::shared_ptr<monitor::MetricsPublisher> publisher_;
  std::string run_id_;
};

// --run-key, --membership, --revocations: a private run's membership (none: an open run).
result<std::optional<auth::MembershipConfig>> membership_config(const TrainOptions& o) {
  if (o.run_key.empty() && o.membership.empty() && o.revocations.empty())
    return std::optional<auth::MembershipConfig>();
  if (o.run_key.empty() || o.membership.empty())
    return make_error(errc::invalid_argument,
                      "a private run needs both --run-key and --membership");
  ST_TRY(auto m, auth::membership_from_files(o.run_key, o.membership, o.revocations));
  return std::optional<auth::MembershipConfig>(std::move(m));
}

}  // namespace

result<void> check_run_identity(const std::vector<monitor::MetricsEntry>& entries,
                                const net::PeerId& self, const std::string& run_id,
                                const std::string& identity, double own_uptime_s) {
  auto c = monitor::older_identity_conflict(entries, self, identity, own_uptime_s);
  if (!c) return success();
  return make_error(
      errc::invalid_argument,
      fmt::format("run '{}' trains \"{}\" (peer {}{}), this peer would train "
                  "\"{}\": the task, data, vocabulary (tokenizer hash), model "
                  "or optimizer differ. Use the same flags and data as the run "
                  "(delete a stale tokenizer cache), or another --run-id",
                  run_id, c->task, c->peer.to_string(),
                  own_uptime_s > 0 ? ", which joined before this one" : "", identity));
}

IdentityWatch::IdentityWatch(TrainNetwork& net, std::string identity, Duration every)
    : net_(net),
      identity_(std::move(identity)),
      every_(every),
      start_(Clock::now()),
      next_(start_ + every) {}

IdentityWatch::~IdentityWatch() {
  if (pending_.valid()) pending_.wait();
}

std::optional<Error> IdentityWatch::poll() {
  if (pending_.valid()) {
    if (pending_.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
      return std::nullopt;
    auto r = pending_.get();
    if (!r && r.error() == errc::invalid_argument) return r.error();
  }
  const auto now = Clock::now();
  if (now < next_) return std::nullopt;
  next_ = now + every_;
  const double uptime = std::max(1e-3, std::chrono::duration<double>(now - start_).count());
  pending_ = std::async(std::launch::async,
                        [this, uptime] { return net_.check_run_identity(identity_, uptime); });
  return std::nullopt;
}

namespace {

// --attack: the collaboration's test-only attack (checked in local mode too). label-flip lives
// in the task (its data), not in the collaboration.
result<collab::NetCollaborationConfig::Attack> parse_attack(const TrainOptions& o) {
  using Attack = collab::NetCollaborationConfig::Attack;
  static constexpr std::pair<std::string_view, Attack> kAttacks[] = {
      {"none", Attack::none},
      {"sign-flip", Attack::sign_flip},
      {"random", Attack::random},
      {"alie", Attack::alie},
      {"label-flip", Attack::none},
      {"stall", Attack::stall},
      {"flood", Attack::flood},
      {"wrong-average", Attack::wrong_average},
      {"different-parts", Attack::different_parts},
      {"false-report", Attack::false_report},
      {"directory-lie", Attack::directory_lie},
      {"stale", Attack::stale},
      {"inflated", Attack::inflated}};
  if (o.attack == "label-flip" && o.task != "fashion")
    return make_error(errc::invalid_argument, "--attack label-flip: only with --task fashion");
  std::string names;
  for (const auto& [name, attack] : kAttacks) {
    if (o.attack == name) return attack;
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  return make_error(errc::invalid_argument, "--attack " + o.attack + ": expected one of " + names);
}

}  // namespace

result<std::unique_ptr<TrainNetwork>> start_train_network(const TrainOptions& o) {
  auto key = load_identity_or_exit(o.identity, true);
  const auto peer = net::PeerId::from_public_key(key.public_key()).to_string();
  if (!o.directory.empty())
    return make_error(errc::unsupported,
                      "--directory is not supported by the networked trainer; start a bootstrap "
                      "node (starling dht) and pass --initial-peers");
  ST_TRY(auto attack, parse_attack(o));
  if (o.initial_peers.empty()) {
    if (attack != collab::NetCollaborationConfig::Attack::none)
      return make_error(errc::invalid_argument,
                        "--attack " + o.attack + " needs a collaboration (--initial-peers)");
    return std::unique_ptr<TrainNetwork>(std::make_unique<AloneNetwork>(peer));
  }
  collab::TrainingNodeConfig cfg;
  cfg.listen = o.listen;
  for (const auto& s : o.initial_peers) {
    auto m = net::Multiaddr::parse(s);
    if (!m) return m.error().with_context("--initial-peers " + s);
    cfg.initial_peers.push_back(std::move(m).value());
  }
  cfg.collab.run_id = o.run_id;
  cfg.collab.client_mode = o.client;
  ST_TRY(cfg.collab.aggregation.kind, averaging::parse_aggregation(o.aggregation));
  cfg.collab.aggregation.tau = o.clip_tau;
  cfg.collab.aggregation.cut = o.clip_cut;
  ST_TRY(averaging::validate(cfg.collab.aggregation));
  cfg.collab.attack = attack;
  using Attack = collab::NetCollaborationConfig::Attack;
  cfg.collab.verify = o.verify;
  if ((cfg.collab.attack == Attack::wrong_average || cfg.collab.attack == Attack::different_parts ||
       cfg.collab.attack == Attack::false_report || cfg.collab.attack == Attack::directory_lie) &&
      !o.verify)
    return make_error(errc::invalid_argument, "--attack " + o.attack + " needs --verify");
  if (o.grad_check > 0 && !o.verify)
    return make_error(errc::invalid_argument, "--grad-check needs --verify");
  cfg.collab.grad_check_targets = o.grad_check;
  ST_TRY(cfg.collab.membership, membership_config(o));
  cfg.relay_service = o.relay;
  cfg.use_relays = o.use_relays;
  cfg.hole_punching = o.hole_punching;
  cfg.allow_private = o.allow_private;
  ST_TRY(cfg.port_mapping, net::port_map_mode(o.port_mapping));
  ST_TRY(auto bw, parse_bandwidth(o.max_bandwidth));
  if (bw > 0) {
    cfg.collab.bandwidth = bw;  // declared to the group: all-reduce shares follow it
    cfg.collab.upload_pace = averaging::AveragerConfig{}.upload_pace;  // rounds pace uploads
    cfg.max_upload_bytes_per_second = cfg.max_download_bytes_per_second = bw;  // enforced
  }
  auto node = collab::TrainingNode::start(std::move(key), cfg);
  if (!node) return node.error().with_context("starting the node");
  return std::unique_ptr<TrainNetwork>(std::make_unique<DhtNetwork>(std::move(node).value(), o));
}

}  // namespace starling::cli
