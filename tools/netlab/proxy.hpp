// The delaying TCP proxy used by netlab to emulate WAN latency, jitter, bandwidth caps and
// stalls on a kernel without netem. Each accepted connection is forwarded to a target (fixed,
// or the original destination of an iptables REDIRECT in transparent mode); bytes in each
// direction are held back by a per-chunk delay (plus seeded jitter, never reordering), paced by
// a per-direction rate cap shared by all connections, and frozen during seeded link stalls.
// Half-close (FIN) and resets (RST) are propagated in order behind the delayed data.
//
// Threading rule: everything runs on one io_context driven by one thread; no locks.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "netlab_io.hpp"

namespace netlab {

// Shaping of one direction of the link.
struct DirectionConfig {
  double delay_ms = 0;   // one-way delay added to every chunk
  double jitter_ms = 0;  // each chunk's delay is uniform in [delay - jitter, delay + jitter]
  double rate_mbit = 0;  // 0 = unlimited; shared by all connections in this direction
};

struct ProxyConfig {
  tcp::endpoint listen;
  std::optional<tcp::endpoint> target;  // empty = transparent mode (SO_ORIGINAL_DST)
  DirectionConfig up;                   // client -> target
  DirectionConfig down;                 // target -> client
  double stall_every_ms = 0;            // mean gap between stalls (0 = no stalls)
  double stall_ms = 0;                  // length of each stall (both directions frozen)
  std::uint64_t seed = 1;
  std::uint32_t mark = 0;  // SO_MARK for outgoing sockets (0 = none)
  double connect_timeout_ms = 5000;
  std::size_t max_buffer = 16u << 20;  // bytes held per direction per connection
  bool verbose = false;
};

// Seeded schedule of link-wide stalls. Windows are generated lazily in time order, so the
// same seed gives the same schedule no matter how often it is queried.
class StallSchedule {
 public:
  StallSchedule(double every_ms, double stall_ms, std::uint64_t seed, TimePoint origin);
  // If `t` falls inside a stall, the time the stall ends; otherwise `t`. Queries must not go
  // backwards by more than the length of one gap (callers pass Clock::now()).
  TimePoint release_after(TimePoint t);
  std::uint64_t stalls_seen() const { return count_; }

 private:
  void next_window();
  bool enabled_;
  Duration stall_;
  double every_ms_;
  std::mt19937_64 rng_;
  TimePoint start_{}, end_{};
  std::uint64_t count_ = 0;
};

// Shared per-direction state: the rate pacer and the jitter random source.
class Direction {
 public:
  Direction(DirectionConfig cfg, std::uint64_t seed);
  // Release time for a chunk read at `now`, never earlier than the previous chunk's of the
  // same connection (`last`), so jitter never reorders bytes.
  TimePoint release_time(TimePoint now, TimePoint last);
  // Pacing: the earliest time `bytes` may be sent; reserves the link for them.
  TimePoint reserve(std::size_t bytes, TimePoint now);
  std::size_t piece_size() const;
  bool paced() const { return cfg_.rate_mbit > 0; }
  std::uint64_t bytes = 0;
  // The one-way delays drawn so far (jitter included), for the stop report: tests check the
  // proxy's own delays instead of inferring them from RTTs that include scheduling noise.
  std::uint64_t delay_samples = 0;
  double delay_min_ms = 0, delay_max_ms = 0;

 private:
  DirectionConfig cfg_;
  std::mt19937_64 rng_;
  TimePoint next_free_{};
};

class Proxy;

// One proxied connection: two sockets, one pump per direction.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Proxy& proxy, tcp::socket client, std::uint64_t id);
  void start(tcp::endpoint target);
  // Closes both sockets; with `rst` the peers see a reset.
  void abort(bool rst);
  std::uint64_t id() const { return id_; }

 private:
  struct Chunk {
    enum Kind { data, eof, reset } kind = data;
    std::vector<std::uint8_t> bytes;
    TimePoint release{};
  };
  struct Pipe {
    explicit Pipe(asio::any_io_executor ex) : to_writer(ex), to_reader(ex), timer(ex) {}
    std::deque<Chunk> queue;
    std::size_t buffered = 0;
    TimePoint last_release{};
    Event to_writer;
    Event to_reader;
    asio::steady_timer timer;
  };
  awaitable<void> run(tcp::endpoint target);
  awaitable<void> read_loop(tcp::socket& src, Pipe& pipe, Direction& dir, const char* name);
  awaitable<void> write_loop(tcp::socket& dst, Pipe& pipe, Direction& dir, const char* name);

  Proxy& proxy_;
  tcp::socket client_;
  tcp::socket server_;
  Pipe up_;    // client -> server
  Pipe down_;  // server -> client
  std::uint64_t id_;
  bool aborted_ = false;
};

class Proxy {
 public:
  Proxy(asio::io_context& io, ProxyConfig cfg);
  // Binds and listens; returns the bound endpoint (port 0 resolved) or an error.
  std::error_code open(tcp::endpoint& bound);
  void start();  // accept loop + signal handling
  void stop();   // closes the listener and every connection

  const ProxyConfig& config() const { return cfg_; }
  Direction& up() { return up_; }
  Direction& down() { return down_; }
  StallSchedule& stalls() { return stalls_; }
  void remove(Connection* c);
  std::uint64_t accepted() const { return accepted_; }
  std::uint64_t failed() const { return failed_; }
  void note_failed() { ++failed_; }
  bool stopping() const { return stopping_; }

 private:
  awaitable<void> accept_loop();
  std::optional<tcp::endpoint> original_destination(tcp::socket& s);

  asio::io_context& io_;
  ProxyConfig cfg_;
  tcp::acceptor acceptor_;
  asio::signal_set signals_;
  Direction up_;
  Direction down_;
  StallSchedule stalls_;
  std::unordered_map<std::uint64_t, std::shared_ptr<Connection>> conns_;
  std::uint64_t next_id_ = 1;
  std::uint64_t accepted_ = 0;
  std::uint64_t failed_ = 0;
  bool stopping_ = false;
};

}  // namespace netlab
