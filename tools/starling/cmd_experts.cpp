// `starling experts serve`: host built-in experts (docs/moe.md) on a DHT node and declare them
// until Ctrl-C. In starling-train (it links libtorch); `starling experts ...` executes it.
#include <iostream>

#include "cli.hpp"
#include "starling/averaging/dht_directory.hpp"
#include "starling/dht/node.hpp"
#include "starling/moe/expert_server.hpp"

namespace starling::cli {
namespace {

struct ExpertsOptions {
  std::string experts = "ffn.[0:4].[0:4]";
  std::string type = "ffn";
  std::int64_t dim = 64, hidden = 256, seq_len = 16, heads = 0;
  double lr = 1e-3;
  std::uint64_t seed = 1;
  std::vector<std::string> listen{"/ip4/0.0.0.0/tcp/0"};
  std::vector<std::string> initial_peers;
  double declare_period_s = 10;
  std::string checkpoint_dir;
  double checkpoint_period_s = 60;
  double fail_rate = 0;
  bool share_state = false;
  bool download_state = false;
  std::uint64_t step_samples = 0;
  double max_step_delay_s = 0;
  std::int64_t max_staleness = -1;
  double average_period_s = 0;
};

awaitable<int> serve_main(std::shared_ptr<ExpertsOptions> o) {
  auto fail = [](const std::string& what) {
    std::cerr << "error: " << what << "\n";
    return 2;
  };
  auto uids = moe::expand_pattern(o->experts);
  if (!uids) co_return fail(uids.error().message());
  std::vector<net::Multiaddr> peers;
  for (const auto& p : o->initial_peers) {
    auto a = net::Multiaddr::parse(p);
    if (!a) co_return fail("--initial-peers " + p + ": " + a.error().message());
    peers.push_back(a.value());
  }
  net::HostConfig hc;
  hc.listen = o->listen;
  auto host =
      net::Host::create(co_await asio::this_coro::executor, crypto::KeyPair::generate(), hc);
  if (auto r = co_await host->start(); !r) co_return fail(r.error().message());
  auto node = dht::DhtNode::create(host, dht::DhtNodeConfig{});
  auto started = co_await node->start(peers);
  moe::ExpertServerConfig cfg;
  cfg.declare_period = seconds(o->declare_period_s);
  cfg.declare_ttl = 2 * cfg.declare_period;
  cfg.checkpoint_dir = o->checkpoint_dir;
  cfg.checkpoint_period = seconds(o->checkpoint_period_s);
  cfg.inject_failure_rate = o->fail_rate;
  cfg.share_state = o->share_state;
  cfg.download_state = o->download_state;
  cfg.step_samples = o->step_samples;
  cfg.max_step_delay = seconds(o->max_step_delay_s);
  if (o->max_staleness >= 0) cfg.max_staleness = static_cast<std::uint64_t>(o->max_staleness);
  cfg.average_period = seconds(o->average_period_s);
  auto server =
      moe::ExpertServer::create(host, std::make_shared<averaging::DhtDirectory>(node), cfg);
  int rc = 0;
  if (!started) {
    rc = fail(started.error().message());
  } else {
    for (const auto& u : uids.value()) {
      auto m = moe::make_builtin_expert(o->type, o->dim, o->hidden,
                                        o->seed + std::hash<std::string>{}(u.to_string()),
                                        o->seq_len, o->heads);
      if (!m) {
        rc = fail(m.error().message());
        break;
      }
      if (auto r =
              server->add_expert(u.to_string(), std::move(m).value(), moe::adam_factory(o->lr));
          !r) {
        rc = fail(r.error().message());
        break;
      }
    }
  }
  if (rc == 0) {
    if (auto r = co_await server->start(); !r) rc = fail(r.error().message());
  }
  if (rc == 0) {
    std::cout << "peer id " << host->local_peer().to_string() << "\n";
    for (const auto& a : host->listen_addresses())
      std::cout << "listening " << a.to_string() << "\n";
    if (server->stats().states_downloaded > 0)
      std::cout << "downloaded " << server->stats().states_downloaded
                << " experts' state from replicas\n";
    if (server->stats().checkpoints_loaded > 0)
      std::cout << "restored " << server->stats().checkpoints_loaded << " experts from "
                << o->checkpoint_dir << "\n";
    std::cout << "serving " << uids.value().size() << " " << o->type << " experts " << o->experts
              << " (dim " << o->dim << ", hidden " << o->hidden << ")" << std::endl;
    (void)co_await sleep_for(std::chrono::hours(24 * 365));  // until Ctrl-C
    co_await asio::this_coro::reset_cancellation_state();    // now clean up, bounded
  }
  co_await server->stop();
  co_await node->stop();
  co_await host->stop();
  if (rc == 0) {
    const auto& st = server->stats();
    std::cout << "stopped: forward rows " << st.forward_rows << ", backward rows "
              << st.backward_rows << ", optimizer steps " << st.optimizer_steps
              << ", injected failures " << st.injected_failures << ", checkpoints saved "
              << st.checkpoints_saved << ", replica averages " << st.replica_averages << std::endl;
  }
  co_return rc;
}

}  // namespace

void add_experts_command(CLI::App& app, Runner& run) {
  auto o = std::make_shared<ExpertsOptions>();
  auto* cmd = app.add_subcommand("experts", "decentralized mixture-of-experts (docs/moe.md)");
  cmd->require_subcommand(1);
  auto* serve = cmd->add_subcommand("serve", "host experts and declare them in the DHT");
  serve->add_option("--experts", o->experts, "uid pattern, e.g. 'ffn.[0:4].[0:4]'")
      ->capture_default_str();
  serve->add_option("--expert-type", o->type, "built-in expert type (ffn, transformer)")
      ->capture_default_str();
  serve->add_option("--dim", o->dim, "input/output width")->capture_default_str();
  serve->add_option("--hidden-dim", o->hidden, "hidden width")->capture_default_str();
  serve->add_option("--seq-len", o->seq_len, "transformer: sequence length")->capture_default_str();
  serve->add_option("--heads", o->heads, "transformer: attention heads (0: auto)")
      ->capture_default_str();
  serve->add_option("--lr", o->lr, "Adam learning rate of every expert")->capture_default_str();
  serve->add_option("--seed", o->seed, "initialisation seed")->capture_default_str();
  serve->add_option("--listen,-l", o->listen, "multiaddr to listen on (repeatable)");
  serve->add_option("--initial-peers,-p", o->initial_peers,
                    "DHT node to join through (repeatable)");
  serve
      ->add_option("--declare-period", o->declare_period_s, "seconds between declarations (ttl 2x)")
      ->capture_default_str();
  serve->add_option("--checkpoint-dir", o->checkpoint_dir,
                    "save every expert here periodically and at exit; restore at start");
  serve->add_option("--checkpoint-period", o->checkpoint_period_s, "seconds between checkpoints")
      ->capture_default_str();
  serve
      ->add_option("--fail-rate", o->fail_rate,
                   "answer this fraction of forward/backward calls with an error (experiments)")
      ->capture_default_str();
  serve->add_flag("--share-state", o->share_state,
                  "serve the experts' state to replicas of the same uids (state transfer)");
  serve->add_flag("--download-state", o->download_state,
                  "at start, download each expert's state from replicas sharing it (experts not "
                  "restored from --checkpoint-dir)");
  serve
      ->add_option("--step-samples", o->step_samples,
                   "SWARM: accumulate gradients, step every expert once per this many rows "
                   "(0: every backward batch)")
      ->capture_default_str();
  serve
      ->add_option("--max-step-delay", o->max_step_delay_s,
                   "SWARM: step anyway once the first accumulated gradient is this many seconds "
                   "old (0: no bound)")
      ->capture_default_str();
  serve
      ->add_option("--max-staleness", o->max_staleness,
                   "refuse a gradient whose forward is more than this many steps old (-1: no "
                   "bound)")
      ->capture_default_str();
  serve
      ->add_option("--average-period", o->average_period_s,
                   "every this many seconds, average each expert's parameters with its replicas "
                   "(servers of the same uid; 0: never)")
      ->capture_default_str();
  serve->callback([&run, o] { run = [o] { return run_main([o] { return serve_main(o); }); }; });
}

}  // namespace starling::cli
