// Test support: one RoundRunner (member 0) on a real Host against a scripted member 1 on a
// second Host: member 1 is a RoundCore driven by hand over raw streams, so a test can shape
// what the runner sees on the wire (e.g. a stream half-closed early). One io thread runs both.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "averaging/round_runner.hpp"
#include "net_harness.hpp"
#include "starling/core/thread_pool.hpp"

namespace starling::averaging::test {

inline constexpr const char* kRunnerTestProtocol = "/starling/test/allreduce";

// Member 1: a RoundCore whose messages go out on its own stream to member 0 and whose input
// comes from the stream member 0 opens to it.
class ScriptedPeer {
 public:
  ScriptedPeer(std::vector<RoundMember> members, std::vector<float> local, RoundConfig cfg,
               TimePoint deadline)
      : local_(std::move(local)),
        out_(local_.size(), 0.0f),
        core_(std::move(members), 1, local_, out_, cfg, Clock::now(), deadline) {}

  // Half-close the stream member 0 opened right after its hello (we never write on it).
  bool close_inbound_early = false;

  RoundCore& core() { return core_; }
  const std::vector<float>& output() const { return out_; }

  awaitable<result<void>> run(net::Host& host, const net::PeerId& to, Bytes group_id) {
    ST_CO_TRY(core_.start(Clock::now()));
    auto s = co_await host.open_stream(to, kRunnerTestProtocol, 10s);
    if (!s) co_return s.error();
    send_ = s.value();
    // Named values for co_await (GCC 12 destroys temporaries in co_await expressions twice).
    const wire::Hello hello{group_id, 1, 0};
    const Bytes frame = net::length_prefixed(wire::encode_hello(hello));
    ST_CO_TRY(co_await send_->write(frame));
    co_return co_await flush();
  }

  awaitable<void> serve(net::ByteStreamPtr s) {
    net::BufferedReader r(*s);
    auto hello = co_await with_timeout(r.read_length_prefixed(wire::kMaxFrame), 10s, "hello");
    if (!hello) co_return;
    inbound_ = s;
    if (close_inbound_early) (void)co_await s->close_write();
    for (;;) {
      auto hdr = co_await r.read_length_prefixed(wire::kMaxFrame);
      if (!hdr) co_return;
      auto f = wire::decode_round(hdr.value(), 2);
      if (!f) co_return;
      if (!std::holds_alternative<RoundMessage>(f.value().msg)) continue;
      RoundMessage msg = std::get<RoundMessage>(f.value().msg);
      std::vector<float> data(f.value().payload_len / sizeof(float));
      if (!data.empty()) {
        MutableBytesView dst(reinterpret_cast<std::uint8_t*>(data.data()), data.size() * 4);
        auto rd = co_await r.read_exact(dst);
        if (!rd) co_return;
      }
      if (auto* p = std::get_if<PartMsg>(&msg)) p->data = data;
      if (auto* m = std::get_if<ResultMsg>(&msg)) m->data = data;
      (void)core_.on_message(0, msg, Clock::now());
      if (!co_await flush()) co_return;
    }
  }

 private:
  // Sends the core's outbox on our stream; once the core is done, half-closes both streams.
  awaitable<result<void>> flush() {
    if (writing_ || !send_) co_return success();
    writing_ = true;
    struct Clear {
      bool* b;
      ~Clear() { *b = false; }
    } clear{&writing_};
    for (auto q = core_.take_outbox(); !q.empty(); q = core_.take_outbox()) {
      for (auto& env : q) {
        std::span<const float> d;
        if (auto* p = std::get_if<PartMsg>(&env.msg)) d = p->data;
        if (auto* m = std::get_if<ResultMsg>(&env.msg)) d = m->data;
        BytesView payload(reinterpret_cast<const std::uint8_t*>(d.data()), d.size_bytes());
        const Bytes header = net::length_prefixed(wire::encode_round(env.msg, payload.size()));
        ST_CO_TRY(co_await send_->write(header));
        if (!payload.empty()) ST_CO_TRY(co_await send_->write(payload));
      }
    }
    if (core_.status() == RoundCore::Status::done && !closed_) {
      closed_ = true;
      (void)co_await send_->close_write();
      if (inbound_ && !close_inbound_early) (void)co_await inbound_->close_write();
    }
    co_return success();
  }

  std::vector<float> local_, out_;
  RoundCore core_;
  net::ByteStreamPtr send_, inbound_;
  bool writing_ = false, closed_ = false;
};

// Two hosts on one io thread, a pool, member 0's runner and member 1's script.
struct RunnerPair {
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard{
      io.get_executor()};
  std::thread thread{[this] { io.run(); }};
  ThreadPool pool{2};
  std::shared_ptr<net::Host> a, b;
  std::vector<float> local0, out0;
  std::shared_ptr<detail::RoundRunner> runner;
  std::unique_ptr<ScriptedPeer> peer;
  Bytes group_id = Bytes(16, 9);

  template <class F>
  auto on_io(F f) {
    return spawn_future(io, std::move(f)).get();
  }

  // N floats per member; `cfg` for the runner (its round config is the script's too).
  RunnerPair(std::size_t n, detail::RoundRunnerConfig cfg, Duration deadline_in,
             bool close_inbound_early) {
    for (auto* h : {&a, &b}) {
      *h = net::Host::create(io.get_executor(), crypto::KeyPair::generate(), net::HostConfig{});
      auto st = on_io([h = *h]() -> awaitable<result<void>> { co_return co_await h->start(); });
      if (!st) throw std::runtime_error(st.error().message());
    }
    a->add_addresses(b->local_peer(), b->listen_addresses());
    b->add_addresses(a->local_peer(), a->listen_addresses());
    // One connection before the round: two simultaneous dials could otherwise race.
    auto conn = on_io([this]() -> awaitable<result<void>> {
      auto peer = a->local_peer();
      co_return co_await b->connect(peer, 10s);
    });
    if (!conn) throw std::runtime_error(conn.error().message());
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> vd(-1, 1);
    std::vector<float> local1(n);
    local0.resize(n);
    for (auto& v : local0) v = vd(rng);
    for (auto& v : local1) v = vd(rng);
    out0.assign(n, std::numeric_limits<float>::quiet_NaN());
    GroupInfo g;
    g.group_id = group_id;
    for (auto* h : {&a, &b})
      g.members.push_back({PeerKey((*h)->local_peer().bytes()), {}, 1000, false, 1.0});
    std::vector<RoundMember> members{{{1000, false}, 1.0}, {{1000, false}, 1.0}};
    const TimePoint deadline = Clock::now() + deadline_in;
    cfg.protocol = kRunnerTestProtocol;
    peer = std::make_unique<ScriptedPeer>(members, std::move(local1), cfg.round, deadline);
    peer->close_inbound_early = close_inbound_early;
    runner = std::make_shared<detail::RoundRunner>(
        *a, g, 0, std::vector<net::PeerId>{a->local_peer(), b->local_peer()}, local0, out0, cfg,
        deadline, pool);
    // Handlers are registered on the hosts' io thread (Host's threading rule).
    on_io([this]() -> awaitable<bool> {
      a->set_stream_handler(
          kRunnerTestProtocol, [r = runner](net::ByteStreamPtr s, net::PeerId) -> awaitable<void> {
            auto rd = std::make_shared<net::BufferedReader>(*s);
            auto h = co_await with_timeout(rd->read_length_prefixed(wire::kMaxFrame), 10s, "hello");
            if (!h) co_return;
            co_await r->serve_inbound(1, s, rd);
          });
      b->set_stream_handler(kRunnerTestProtocol,
                            [p = peer.get()](net::ByteStreamPtr s, net::PeerId) -> awaitable<void> {
                              co_await p->serve(s);
                            });
      co_return true;
    });
  }

  // Starts the round on both members; the future holds member 0's result.
  std::future<result<void>> start() {
    // The runner first: its core must have started before member 1's frames arrive.
    auto fut = spawn_future(io, [r = runner]() { return r->run(); });
    asio::co_spawn(
        io,
        [this]() -> awaitable<void> { (void)co_await peer->run(*b, a->local_peer(), group_id); },
        asio::detached);
    return fut;
  }

  ~RunnerPair() {
    on_io([this]() -> awaitable<int> {
      co_await a->stop();
      co_await b->stop();
      co_return 0;
    });
    pool.shutdown();
    guard.reset();
    thread.join();
  }
};

}  // namespace starling::averaging::test
