// starling-delay-proxy: a delaying TCP proxy for netlab (WAN latency, jitter, bandwidth caps
// and stalls without netem). Single-threaded asio; exits cleanly on SIGINT/SIGTERM.
//
//   starling-delay-proxy --listen 127.0.0.1:0 --target 10.77.1.2:4001 --delay-ms 20
//   starling-delay-proxy --listen 127.0.0.1:7777 --transparent --delay-ms 20   # iptables REDIRECT
//
// Prints "listening ADDR:PORT" on stdout once it accepts connections.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>

#include "proxy.hpp"

int main(int argc, char** argv) {
  using namespace netlab;
  CLI::App app{"Delaying TCP proxy for netlab: adds one-way delay, jitter, rate caps and stalls."};
  std::string listen = "127.0.0.1:0";
  std::string target;
  bool transparent = false;
  double delay = 0, jitter = 0, rate = 0;
  double up_delay = -1, down_delay = -1, up_rate = -1, down_rate = -1;
  std::string port_file;
  ProxyConfig cfg;
  app.add_option("--listen", listen, "listen address ADDR:PORT (port 0 = any)");
  app.add_option("--target", target, "forward every connection to ADDR:PORT");
  app.add_flag("--transparent", transparent,
               "forward to the original destination of an iptables REDIRECT (SO_ORIGINAL_DST)");
  app.add_option("--delay-ms", delay, "one-way delay added in each direction")
      ->check(CLI::Range(0.0, 600000.0));
  app.add_option("--up-delay-ms", up_delay, "one-way delay client->target (overrides)")
      ->check(CLI::Range(0.0, 600000.0));
  app.add_option("--down-delay-ms", down_delay, "one-way delay target->client (overrides)")
      ->check(CLI::Range(0.0, 600000.0));
  app.add_option("--jitter-ms", jitter, "delay varies uniformly by +-jitter (no reordering)")
      ->check(CLI::Range(0.0, 600000.0));
  app.add_option("--rate-mbit", rate, "bandwidth cap per direction, shared by connections")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--up-rate-mbit", up_rate, "cap client->target (overrides)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--down-rate-mbit", down_rate, "cap target->client (overrides)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--stall-every-ms", cfg.stall_every_ms,
                 "mean gap between link stalls (uniform in [0.5, 1.5] x this); 0 = none")
      ->check(CLI::Range(0.0, 1e9));
  app.add_option("--stall-ms", cfg.stall_ms, "length of each stall (both directions frozen)")
      ->check(CLI::Range(0.0, 1e9));
  app.add_option("--seed", cfg.seed, "seed for jitter and stalls");
  app.add_option("--mark", cfg.mark,
                 "SO_MARK for outgoing connections (transparent mode default 0x4e4c)");
  app.add_option("--connect-timeout-ms", cfg.connect_timeout_ms, "deadline to reach the target")
      ->check(CLI::Range(1.0, 600000.0));
  std::size_t max_buffer_kb = cfg.max_buffer / 1024;
  app.add_option("--max-buffer-kb", max_buffer_kb, "bytes held per direction per connection")
      ->check(CLI::Range(64, 1 << 22));
  app.add_option("--port-file", port_file, "also write the bound port to this file");
  app.add_flag("-v,--verbose", cfg.verbose, "log connections to stderr");
  app.get_formatter()->column_width(40);
  CLI11_PARSE(app, argc, argv);

  auto l = parse_endpoint(listen);
  if (!l) {
    std::fprintf(stderr, "delay-proxy: bad --listen '%s' (want ADDR:PORT)\n", listen.c_str());
    return 2;
  }
  cfg.listen = *l;
  if (transparent == !target.empty()) {
    std::fprintf(stderr, "delay-proxy: give exactly one of --target or --transparent\n");
    return 2;
  }
  if (!target.empty()) {
    auto t = parse_endpoint(target);
    if (!t) {
      std::fprintf(stderr, "delay-proxy: bad --target '%s' (want ADDR:PORT)\n", target.c_str());
      return 2;
    }
    cfg.target = *t;
  } else if (app.count("--mark") == 0) {
    cfg.mark = 0x4e4c;
  }
  cfg.up = {up_delay >= 0 ? up_delay : delay, jitter, up_rate >= 0 ? up_rate : rate};
  cfg.down = {down_delay >= 0 ? down_delay : delay, jitter, down_rate >= 0 ? down_rate : rate};
  cfg.max_buffer = max_buffer_kb * 1024;

  asio::io_context io;
  Proxy proxy(io, cfg);
  tcp::endpoint bound;
  if (auto ec = proxy.open(bound)) {
    std::fprintf(stderr, "delay-proxy: cannot listen on %s: %s\n", listen.c_str(),
                 ec.message().c_str());
    return 1;
  }
  if (!port_file.empty()) {
    std::string tmp = port_file + ".tmp";
    {
      std::ofstream f(tmp);
      f << bound.port() << "\n";
    }
    std::rename(tmp.c_str(), port_file.c_str());
  }
  std::printf("listening %s\n", to_string(bound).c_str());
  std::fflush(stdout);
  proxy.start();
  io.run();
  // The range of the delays drawn in both directions; a direction that drew none has no say.
  struct {
    double min_ms = 0, max_ms = 0;
  } delays;
  bool any = false;
  for (const Direction* d : {&proxy.up(), &proxy.down()}) {
    if (d->delay_samples == 0) continue;
    delays.min_ms = any ? std::min(delays.min_ms, d->delay_min_ms) : d->delay_min_ms;
    delays.max_ms = any ? std::max(delays.max_ms, d->delay_max_ms) : d->delay_max_ms;
    any = true;
  }
  std::fprintf(
      stderr,
      "delay-proxy: stopped; connections=%llu failed=%llu up_bytes=%llu "
      "down_bytes=%llu stalls=%llu delays=%llu delay_min_ms=%.3f delay_max_ms=%.3f\n",
      static_cast<unsigned long long>(proxy.accepted()),
      static_cast<unsigned long long>(proxy.failed()),
      static_cast<unsigned long long>(proxy.up().bytes),
      static_cast<unsigned long long>(proxy.down().bytes),
      static_cast<unsigned long long>(proxy.stalls().stalls_seen()),
      static_cast<unsigned long long>(proxy.up().delay_samples + proxy.down().delay_samples),
      delays.min_ms, delays.max_ms);
  return 0;
}
