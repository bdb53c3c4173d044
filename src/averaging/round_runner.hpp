// RoundRunner: drives one RoundCore over libp2p streams. Every member opens one stream to each
// non-client member (protocol kAllReduceProtocol) and sends a Hello; messages to a non-client go
// on our own stream to it, messages to a client on the stream it opened to us. Frames are a
// length-prefixed RoundFrame, followed for parts and results by the raw float32 payload, written
// straight from the round's buffers. Each peer has one writer (keepalives when idle) and each
// stream one reader (activity reported per chunk, so slow but live peers are not timed out).
// Reductions run on the worker pool. A peer the core marks failed is fenced: its streams are
// reset. When the core finishes, writers drain, streams are half-closed, readers see EOF.
//
// Threading rule: everything on the host's executor except run_reduce_job() calls on the pool.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include "starling/core/timer.hpp"

#include "part_codec.hpp"
#include "round_acct.hpp"
#include "starling/averaging/grad_check.hpp"
#include "starling/averaging/round_core.hpp"
#include "starling/averaging/wire.hpp"
#include "starling/net/byte_stream.hpp"
#include "starling/net/stream_host.hpp"

namespace starling::averaging::detail {

struct RoundRunnerConfig {
  RoundConfig round;
  Duration keepalive_interval = 1s;
  Duration open_timeout = 10s;
  Duration linger = 3s;  // after the end: draining writes and waiting for peers' EOF
  std::string protocol = kAllReduceProtocol;         // the averager's all-reduce protocol id
  std::function<void(const std::string&)> on_phase;  // test hook
  // Test hook: runs on the pool right before a part's reduction (may block, like slow compute).
  std::function<void(std::uint32_t part)> before_reduce;
  // Per-tensor codecs for parts and results on the wire (null or not compressed(): raw
  // float32). Must outlive the runner.
  const TensorCodecs* codecs = nullptr;
  // This member's upload pace in bytes/s (0: not paced) and its burst (UploadPacer).
  double upload_rate = 0;
  std::size_t upload_burst = 64 * 1024;
  // Error feedback (both empty: off; else N floats each): residual carried from earlier
  // rounds, added to this member's values before they are encoded; residual_out receives
  // what this round's encodings lost (elements this member did not send keep their residual).
  std::span<const float> residual;
  std::span<float> residual_out;
  // The same for the results this member encodes as an owner (error feedback on the mean it
  // sends: what was lost is added the next time it owns those elements).
  std::span<const float> result_residual;
  std::span<float> result_residual_out;
  // Accountability (round_acct.hpp; null: off). Needs uncompressed parts and Ed25519 peer
  // ids; every member of the group must run it.
  std::shared_ptr<const RoundAcctConfig> acct;
  bool stall = false;  // test-only: after the hellos, send nothing (AveragerConfig::test_stall)
  // Called once when another member's part arrives while this member's data is still pending:
  // the others have reached the target, so the caller may supply its data now.
  std::function<void()> on_peer_data;
};

// A round's milestones (Clock; unset: not reached): the runner started, this member's data
// came, the inputs of every part it owns were in (the others' data; for a member owning no
// part, its own), the core was done, the round closed.
struct RoundTimes {
  TimePoint start{}, local{}, inputs{}, done{}, closed{};
};

// A token bucket shared by a round's writers: `rate` bytes/s, at most `burst` bytes at once.
// take() books n bytes and says how long to wait before sending them (bookings queue up, so
// the writers together never exceed the rate).
struct UploadPacer {
  double rate = 0, burst = 0, tokens = 0;
  TimePoint last{};
  Duration take(std::size_t n, TimePoint now) {
    if (rate <= 0) return Duration::zero();
    if (last == TimePoint{})
      tokens = burst;
    else
      tokens = std::min(burst, tokens + std::chrono::duration<double>(now - last).count() * rate);
    last = now;
    tokens -= static_cast<double>(n);
    if (tokens >= 0) return Duration::zero();
    return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(-tokens / rate));
  }
};

// Adds the worker time of the scope it lives in to `ns` (codec time of pool tasks).
struct Timed {
  std::atomic<std::int64_t>* ns;
  TimePoint t0 = Clock::now();
  ~Timed() {
    ns->fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  }
};

// Shared by a round and its pool tasks that touch the round's buffers (the caller's input,
// output and residuals): a task enters before it touches them and leaves after; once the
// round closes the gate (it stopped waiting, see RoundRunner::run()), no task enters.
struct PoolGate {
  std::atomic<bool> closed{false};
  std::atomic<int> inside{0};
  bool enter() {
    inside.fetch_add(1);
    if (!closed.load()) return true;
    inside.fetch_sub(1);
    return false;
  }
  void leave() { inside.fetch_sub(1); }
  struct Pass {
    PoolGate* g;
    bool ok;
    explicit Pass(PoolGate* gate) : g(gate), ok(gate->enter()) {}
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
    ~Pass() {
      if (ok) g->leave();
    }
  };
};

class RoundRunner : public std::enable_shared_from_this<RoundRunner> {
 public:
  RoundRunner(net::StreamHost& host, GroupInfo group, std::uint32_t self,
              std::vector<net::PeerId> peers, std::span<const float> local, std::span<float> output,
              RoundRunnerConfig cfg, TimePoint deadline, ThreadPool& pool);
  ~RoundRunner();

  // Runs the round to its end and closes its streams. The error is the core's.
  awaitable<result<void>> run();
  // run() in two halves: settle() runs the round until the core is done or failed (or the
  // deadline passed); close() then drains, closes the streams, waits for the pool tasks and
  // returns the round's outcome. An error from settle() means no stream was opened.
  awaitable<result<void>> settle();
  awaitable<result<void>> close();
  // After settle(): the core is done and close() will touch neither the output nor the input
  // any more except to send what is already there (no accountability, no codec, no pool task),
  // so the caller may use the result while close() runs in the background.
  const RoundTimes& times() const { return times_; }
  // An inbound stream from member `from` whose Hello was read by `reader`; reads it until the
  // round ends. Returns at once if the stream is not acceptable.
  awaitable<void> serve_inbound(std::uint32_t from, net::ByteStreamPtr stream,
                                std::shared_ptr<net::BufferedReader> reader);

  // Late data (constructed with an empty `local`): this member's values and weight; its parts
  // go out at once. `local` must stay valid and unchanged until run() returns.
  // With a non-empty `output` the round's result goes there instead, if the core can still
  // move its output (RoundCore::retarget_output; output_retargeted() tells).
  result<void> provide_local(std::span<const float> local, double weight,
                             std::span<float> output = {});
  bool output_retargeted() const noexcept { return retargeted_; }
  // Without data by `t` the round is abandoned (errc::timeout): this member leaves and the
  // others drop it like a lost peer. Call before run().
  void set_local_deadline(TimePoint t) { local_deadline_ = t; }
  // Ends the round now with `e` (the core fails; streams are closed).
  void abandon(Error e);

  const RoundCore& core() const { return core_; }
  const GroupInfo& group() const { return group_; }
  std::uint64_t bytes_sent() const { return bytes_sent_; }
  std::uint64_t bytes_received() const { return bytes_received_; }
  // Time the worker threads spent encoding and decoding this round's parts.
  Duration codec_time() const { return std::chrono::nanoseconds(codec_ns_.load()); }
  bool finished() const { return core_.status() != RoundCore::Status::running; }
  // Accountability: statements' evidence found and parts checked by the aggregation check.
  std::size_t evidence_found() const { return acct_ ? acct_->evidence_count() : 0; }
  std::size_t checked_parts() const { return checked_parts_; }
  // Gradient check: the drawn targets' values on this member's parts (round_runner_grad.cpp).
  std::vector<ContributionSample> take_grad_samples() { return std::move(grad_samples_); }

 private:
  struct OutFrame {
    RoundMessage msg;                   // Part/Result data spans point into the round's buffers
    std::shared_ptr<const Bytes> acct;  // set: an ACCT frame with this statement instead
  };
  // Marks a result being received in place (RoundCore::result_destination) for its reader's
  // current frame, so that no second stream writes into the same part meanwhile.
  struct InPlace {
    RoundRunner* r;
    std::optional<std::pair<std::uint32_t, std::uint32_t>> key;
    void hold(std::pair<std::uint32_t, std::uint32_t> k);
    ~InPlace();
  };
  struct Peer {
    net::ByteStreamPtr send;
    std::vector<net::ByteStreamPtr> streams;
    std::deque<OutFrame> queue;
    std::unique_ptr<AsyncEvent> wake;
    bool fenced = false;
    bool inbound_seen = false;
    std::uint32_t ended = 0;  // streams that ended cleanly (EOF at a frame boundary)
    bool heard = false;       // a frame arrived from this peer
    bool lost = false;        // a stream of this peer failed
    bool writing = false;     // a frame is being written (drained() waits for it)
    bool busy = false;        // a part or result is being written
    // Balanced progress (balance_ahead()): elements of parts and results this sub-round.
    std::uint64_t flow_total = 0, flow_sent = 0, parts_total = 0;
  };

  awaitable<void> connect(std::uint32_t j);
  awaitable<void> writer(std::uint32_t j);
  // Writes a frame's header and payload, paced by pacer_ (in bursts) when it is on.
  awaitable<result<void>> paced_write(net::ByteStream& s, BytesView header, BytesView payload);
  awaitable<void> reader(std::uint32_t j, net::ByteStreamPtr s,
                         std::shared_ptr<net::BufferedReader> r);
  awaitable<void> timer_loop();
  void pump();
  awaitable<void> reduce_part(ReduceJob job);
  // Values read and written by a reduction small enough to run on the I/O thread (~1 MB).
  static constexpr std::size_t kInlineReduceValues = 256 * 1024;
  bool reduce_here(const ReduceJob& job) const;
  bool compressed() const { return cfg_.codecs && cfg_.codecs->compressed(); }
  void stream_lost(std::uint32_t j, const Error& e, bool blame);
  // A stream of j ended cleanly; once all of j's streams have, the core learns j closed.
  void stream_ended(std::uint32_t j);
  std::uint32_t expected_streams(std::uint32_t j) const;
  // Counts a pool task that may touch the round's buffers while it lives (`adopt`: the count
  // was taken already, when the task was spawned).
  struct PoolUse {
    RoundRunner* r;
    explicit PoolUse(RoundRunner* rr, bool adopt = false) : r(rr) {
      if (!adopt) ++r->pool_tasks_;
    }
    PoolUse(const PoolUse&) = delete;
    PoolUse& operator=(const PoolUse&) = delete;
    ~PoolUse() {
      if (--r->pool_tasks_ == 0) r->pool_idle_.set();
    }
  };
  // Waits for the pool tasks, at most until max(deadline, now) + linger; then closes the gate
  // (tasks that have not started touching the buffers never will) and waits for those inside.
  awaitable<void> wait_pool_tasks();
  // Balanced progress: the writers share this member's uplink, and TCP shares it unevenly, so
  // a writer whose flow is ahead of the slowest flow with data ready holds its next part or
  // result back a little (bounded) and lets the others catch up.
  void balance_plan();
  bool balance_ahead(std::uint32_t j) const;
  void fence(std::uint32_t j);
  // Debug log of a flow's milestones (its parts, then everything, sent) for time series.
  void log_flow(std::uint32_t j, std::uint64_t before) const;
  bool drained() const;
  // Accountability (round_runner_acct.cpp).
  result<void> acct_init();
  bool reachable(std::uint32_t j) const;  // two clients never talk
  void send_acct(std::uint32_t j, std::shared_ptr<const Bytes> statement);
  void route(Envelope env);
  awaitable<void> commit_sub(std::uint32_t sub, double weight);
  awaitable<result<void>> acct_check(std::uint32_t j, const RoundMessage& msg,
                                     const Bytes& receipt);
  // What acct_wait() waits for: every reveal, every report of the settled parts, every
  // member's checked marker, the answered marker of every owner this member accused.
  enum class AcctWait { reveals, reports, checked, answered };
  bool acct_ready(AcctWait w, const std::vector<SettledPart>& settled) const;
  awaitable<void> acct_wait(TimePoint until, AcctWait w, const std::vector<SettledPart>& settled);
  awaitable<void> acct_phase();
  awaitable<void> acct_answers();
  void send_evidence(std::uint32_t j, const acct::Evidence& e);
  // j will send nothing more in this round (its streams ended or failed, or it was fenced).
  bool gone(std::uint32_t j) const;

  net::StreamHost& host_;
  GroupInfo group_;
  std::uint32_t self_;
  std::uint32_t n_;
  std::vector<net::PeerId> peers_;
  RoundRunnerConfig cfg_;
  TimePoint deadline_;
  TimePoint local_deadline_ = TimePoint::max();
  ThreadPool& pool_;
  asio::any_io_executor ex_;
  std::span<const float> local_;
  std::span<float> output_;
  bool retargeted_ = false;
  RoundCore core_;
  std::vector<Peer> p_;
  TaskScope scope_;
  Timer timer_;
  AsyncEvent done_, progress_;
  AsyncEvent balance_;  // pulsed when a flow progresses
  UploadPacer pacer_;
  std::uint32_t balance_sub_ = ~0u;
  std::size_t pool_tasks_ = 0;  // pool tasks (reductions, encodings) not yet returned
  std::shared_ptr<PoolGate> gate_ = std::make_shared<PoolGate>();
  // (sub-round, part)
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::shared_ptr<const Bytes>> encoded_results_;
  std::size_t readers_ = 0;
  std::set<std::pair<std::uint32_t, std::uint32_t>> receiving_;  // (sub-round, part) in place
  std::atomic<std::int64_t> codec_ns_{0};  // worker time spent encoding and decoding
  TimePoint started_{};
  void connecting_grace(TimePoint now);
  AsyncEvent pool_idle_;
  bool ending_ = false;
  std::string last_phase_;
  std::uint64_t bytes_sent_ = 0, bytes_received_ = 0;
  std::unique_ptr<RoundAcct> acct_;
  std::deque<Envelope> held_;  // outbox waiting for a commitment
  bool committing_ = false;
  AsyncEvent acct_event_{ex_};  // pulsed on every statement received
  std::size_t checked_parts_ = 0;
  std::vector<ContributionSample> grad_samples_;
  void collect_grad_samples(const std::vector<SettledPart>& settled);
  RoundTimes times_;
  bool peer_data_told_ = false;
  void note_times();
};

}  // namespace starling::averaging::detail
