// RoundCore: one member's side of one fault-tolerant butterfly all-reduce, as a protocol core
// that does no I/O and takes time as a parameter. The networked Averager feeds it decoded
// messages and failure notices, and sends what it puts in its outbox; tests drive many of
// them through a simulated network.
//
// Protocol (docs/averaging.md has the full rules and what happens to a lost peer per phase).
// A round is a sequence of sub-rounds; sub-round 0 covers the whole vector, sub-round k+1
// re-reduces only the parts the group agreed to redo in sub-round k. Each sub-round:
//   1. reduce-scatter: every sender (every member not agreed failed) sends its values of each
//      part to the part's owner (plan from make_plan(): bandwidth-optimal shares);
//   2. per-part reduction: as soon as an owner holds a part from every sender it does not
//      consider failed, it reduces that part over the senders it holds it from (its tag T_p),
//      in group order: sum_s (w_s / W) * x_s, W = sum of the weights in T_p (equal weights if
//      W == 0), and
//   3. all-gather: sends the reduced part, tagged with T_p, to every member at once, while
//      its other parts may still be arriving (no barrier between the phases);
//   4. fin: each member, once it holds every part or knows the part's owner failed, sends
//      Fin1 {parts missing, members it saw fail, members that sent it garbage, intersection
//      of the tags of the parts it owns} to every non-client; each non-client, once it has
//      Fin1 from every live member, relays all the Fin1s it got as Fin2 to every member; each
//      member merges the Fin2s into the same table D and decides (decide_fin()): excluded =
//      members with no Fin1 in D, plus a deterministic cover of the conflicts among the
//      others (two members that lost each other cannot both stay); missing = parts reported
//      missing by non-excluded members; counted C = the intersection of the non-excluded
//      members' tag intersections, minus the owners of missing parts. A part is redone if it
//      is missing or its tag differs from C. Nothing to redo: done. Otherwise the parts to
//      redo are re-partitioned among C minus the excluded (sub-round k+1) and every member,
//      including one that already held such a part, adopts the new values.
// Every part's final value therefore comes from exactly one owner, so members that succeed
// hold bit-identical results, and every part settled in a sub-round counts the same members
// (a lost member's contribution is dropped from all of them or from none). A member that
// finds itself excluded, loses every non-client, or reaches the deadline fails
// (errc::timeout / unavailable) and must not use output().
//
// Threading rule: single-threaded (the node's I/O thread). The only exception: ReduceJobs
// handed out by take_reduce_jobs() may run on any thread; the core touches neither a job's
// inputs nor its output until on_reduced() is called for its part.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "starling/averaging/float_buffer.hpp"
#include "starling/averaging/partition.hpp"
#include "starling/averaging/robust.hpp"
#include "starling/averaging/types.hpp"
#include "starling/core/clock.hpp"

namespace starling::averaging {

// --- messages (the wire codec lives in round_wire.hpp) ---
struct PartMsg {  // sender -> owner: the sender's values of one part
  std::uint32_t subround = 0;
  std::uint32_t part = 0;
  std::span<const float> data;
  // The sender's weight: owners reduce with the weights that come with the parts, so a
  // member may supply its weight after the group formed (RoundCore::provide_local()). Every
  // part of one sender carries the same weight.
  double weight = 1.0;
};
struct ResultMsg {  // owner -> members: one reduced part
  std::uint32_t subround = 0;
  std::uint32_t part = 0;
  Bitset counted;  // over members: whose values are in this mean
  std::span<const float> data;
};
// One member's view at the end of a sub-round's all-gather.
struct FinReport {
  std::uint32_t member = 0;
  Bitset missing;  // over the sub-round's parts: parts it does not hold (their owner failed)
  Bitset failed;   // over members: members it saw fail (lost, stalled or misbehaving)
  Bitset blamed;   // subset of failed: members that sent it malformed data
  // Over members: the intersection of the tags of the parts it owns (all set if it owns none).
  Bitset counted;
  friend bool operator==(const FinReport&, const FinReport&) = default;
};
// Stage 1: member -> non-clients, exactly its own report. Stage 2: non-client -> members,
// every stage-1 report it received (including its own).
struct FinMsg {
  std::uint32_t subround = 0;
  std::uint8_t stage = 1;
  std::vector<FinReport> reports;
};
using RoundMessage = std::variant<PartMsg, ResultMsg, FinMsg>;

struct Envelope {
  std::uint32_t to = 0;  // member index
  RoundMessage msg;
};

// The fin decision, a pure function of the merged Fin2 table (identical on every member that
// received the same Fin2s). `reports` is indexed by member (nullopt: no Fin1 from it).
struct FinDecision {
  Bitset excluded;  // over members
  Bitset missing;   // over parts
  Bitset counted;   // over members: the counted set every part settled in this sub-round has
};
FinDecision decide_fin(const std::vector<std::optional<FinReport>>& reports, const Bitset& alive,
                       const std::vector<bool>& client, const std::vector<PartSpec>& parts);

// A reduction to run (anywhere): with the mean aggregation out = sum_j coeffs[j] * inputs[j],
// summed in j order; with centered_clip, CenteredClip of the inputs with `weights` (the
// senders' weights as given; robust.hpp caps them).
struct ReduceJob {
  std::uint32_t subround = 0;
  std::uint32_t part = 0;
  std::span<float> out;
  std::vector<std::span<const float>> inputs;
  std::vector<float> coeffs;
  std::vector<double> weights;
  AggregationConfig aggregation;
};
void run_reduce_job(const ReduceJob& job);

struct RoundMember {
  Capacity cap;
  double weight = 1.0;
};

struct RoundConfig {
  std::size_t part_elems = kDefaultPartElems;
  // A peer we wait on that shows no activity (any bytes) for this long is treated as failed.
  // The driver keeps live peers active with keepalives at a fraction of this.
  Duration stall_timeout = 10s;
  // Reject parts/results holding NaN or infinity (treated as malformed).
  bool reject_non_finite = true;
  // How this member reduces the parts it owns (robust.hpp): the weighted mean, or
  // CenteredClip, which bounds what any one member can do to the result.
  AggregationConfig aggregation;
  // Reduce inside the core as soon as ready (tests); otherwise hand out ReduceJobs.
  bool inline_reduce = true;
  // For the networked driver (not the core): balanced progress across this member's writers
  // (0: off). A writer more than `balance_slack` parts ahead of the slowest flow that has data
  // ready waits for it, at most `balance_hold` per frame.
  std::size_t balance_slack = 2;
  Duration balance_hold = 300ms;
};

struct RoundTimings {
  TimePoint started, reduce_scatter_done, all_gather_done, finished;
};

class RoundCore {
 public:
  enum class Status { running, done, failed };

  // `local` (this member's values, N floats) must stay valid and unchanged while the core
  // lives; `output` (N floats) receives the averaged vector and is meaningful only once
  // status() == done. Members are in group order; `self` is this member's index.
  // An empty `local` (with a non-empty output) means the data comes later: the core takes
  // part in the round (receives parts and results) but sends nothing of its own and reduces
  // nothing until provide_local(); the others wait for it like for a slow member.
  RoundCore(std::vector<RoundMember> members, std::uint32_t self, std::span<const float> local,
            std::span<float> output, RoundConfig cfg, TimePoint now, TimePoint deadline);

  // Plans sub-round 0 and queues this member's parts. Errors: invalid members/config.
  result<void> start(TimePoint now);

  // A decoded message from member `from`. An error means `from` broke the protocol: the core
  // has already marked it failed (and logged why); the caller should close its streams.
  // `owned`: the buffer that msg's data span covers exactly, which the core may take (moved
  // from) instead of copying the values.
  result<void> on_message(std::uint32_t from, const RoundMessage& msg, TimePoint now,
                          FloatBuffer* owned = nullptr);
  // Where a result of `count` values for (subround, part) from `from` would be stored if it
  // arrived now and is valid: the driver may receive it there directly and then pass a
  // ResultMsg whose data is that span. Empty when it must be buffered (not expected now).
  // Values written there count only once on_message() accepts the result; until then the
  // part is not held, so a rejected or partial result is never used. The driver must not
  // let two receptions target the same part at once.
  std::span<float> result_destination(std::uint32_t from, std::uint32_t subround,
                                      std::uint32_t part, std::size_t count) const;
  // Bytes (of any message, even partial) arrived from `from`: it is alive.
  void on_activity(std::uint32_t from, TimePoint now);
  // The transport lost `peer` (stream reset/closed early, dial failed, malformed bytes).
  // `blame`: the peer misbehaved (malformed bytes), as opposed to vanishing.
  void on_peer_failed(std::uint32_t peer, const std::string& reason, TimePoint now,
                      bool blame = false);
  // The transport saw every stream of `peer` end cleanly (EOF at a frame boundary). Not a
  // failure by itself: a member that finished has sent everything and closes. It becomes one
  // as soon as this member waits on `peer` for anything (now or later in the round).
  void on_peer_closed(std::uint32_t peer, TimePoint now);
  // Advances timers (stall detection, deadline).
  void tick(TimePoint now);
  // Late data (the core was built with an empty `local`): this member's values (N floats,
  // valid and unchanged while the core lives) and weight, which replaces the one in its
  // RoundMember. Its parts go out at once. Errors: not waiting for data, wrong size, bad weight.
  result<void> provide_local(std::span<const float> local, double weight, TimePoint now);
  bool local_pending() const noexcept { return local_pending_; }
  // Moves the output to `output` (N floats) if nothing has been written into the old one or
  // handed out for writing yet (true), so that late data can bring its own destination;
  // otherwise (false) the output stays where it is.
  bool retarget_output(std::span<float> output);
  // Gives up (e.g. the data did not come in time): the core fails with `e`; the driver then
  // closes its streams, so the others drop this member like a lost peer.
  void abandon(Error e);
  // Member m's weight as this member knows it: its own, the one its parts carried here, else
  // the one from its RoundMember (the group's).
  double weight_of(std::uint32_t m) const;
  // With inline_reduce == false: reductions ready to run (one per part), then on_reduced()
  // for each part once its job ran (the driver may re-encode part_output() before that).
  std::vector<ReduceJob> take_reduce_jobs();
  void on_reduced(std::uint32_t subround, std::uint32_t part, TimePoint now);

  std::vector<Envelope> take_outbox();
  // Earliest time tick() has something to do.
  TimePoint next_wakeup() const;

  Status status() const noexcept { return status_; }
  const Error& error() const noexcept { return error_; }
  std::uint32_t subround() const noexcept { return sub_.index; }
  std::string phase() const;
  // Members this member saw fail or the group agreed failed (over members).
  const Bitset& failed() const noexcept { return failed_; }
  // Elements of the final vector in which each member's values were counted.
  const std::vector<std::uint64_t>& counted_elements() const noexcept { return counted_elems_; }
  // Which members are counted in each range of the final vector (ranges tile [0, N)).
  // Each settled part: its range, its counted set, and the sub-round, part index and owner
  // it was settled in (accountability checks them after the round).
  struct Coverage {
    Segment range;
    Bitset counted;
    std::uint32_t subround = 0, part = 0, owner = 0;
  };
  const std::vector<Coverage>& coverage() const noexcept { return coverage_; }
  const RoundTimings& timings() const noexcept { return timings_; }
  std::span<float> output() const noexcept { return output_; }
  // Applied when the owner's own result is final; the driver may replace it (e.g. by
  // decode(encode(x)) so that the owner holds exactly what it sends). Valid after reduction.
  std::span<float> part_output(std::uint32_t part) const;
  const RoundPlan& plan() const noexcept { return sub_.plan; }
  // Bytes held for messages of the next sub-round (kept until it starts), exactly: their float
  // payloads, their Fin reports' bitsets and a fixed sizeof(Buffered) each. A peer may be
  // ahead by at most what it could legitimately send in one sub-round (N floats of parts, N
  // of results, one Fin of each stage; no part or result twice); more is a protocol violation.
  std::size_t held_bytes() const noexcept { return held_bytes_; }
  static std::size_t held_per_message() noexcept;  // the fixed part of each held message

 private:
  struct Buffered {  // a message for the next sub-round, kept until it starts
    std::uint32_t from = 0;
    RoundMessage msg;
    FloatBuffer data;  // owned copy; msg's span points here
  };
  struct Sub {
    std::uint32_t index = 0;
    RoundPlan plan;
    Bitset alive;  // agreed senders of this sub-round
    // owner side, indexed like my_parts
    std::vector<std::uint32_t> my_parts;
    std::vector<std::vector<FloatBuffer>> slots;   // [my part idx][member]
    std::vector<Bitset> have;                      // senders whose values of the part are in
    std::vector<std::uint8_t> requested, reduced;  // reduction handed out / finished
    std::vector<std::uint32_t> owed;               // by member: parts it still owes me
    std::size_t next_unrequested = 0;              // my parts before it are all requested
    std::size_t reduced_count = 0;
    Bitset mine_counted;  // intersection of my parts' tags
    // member side
    Bitset got;                                               // parts held
    std::vector<Bitset> part_counted;                         // tag of each held part
    std::vector<std::optional<FinReport>> fin1;               // by member (non-client only)
    std::vector<std::optional<std::vector<FinReport>>> fin2;  // by non-client
    bool fin1_sent = false, fin2_sent = false;
  };

  bool is_owner() const;
  std::uint32_t my_part_index(std::uint32_t part) const;  // index into sub_.my_parts
  void begin_subround(std::uint32_t index, std::vector<Segment> segments, Bitset alive,
                      TimePoint now);
  void send_parts();
  void advance(TimePoint now);
  bool rs_complete() const;
  bool part_ready(std::size_t i) const;
  void start_reductions(TimePoint now);
  void finish_part(std::size_t i);
  bool gather_complete() const;
  bool fin1_complete() const;
  bool fin2_complete() const;
  void decide(TimePoint now);
  Bitset waiting_on() const;
  void fail_closed_waits();
  void mark_failed(std::uint32_t peer, const std::string& reason, bool blame = false);
  void fail(Error e);
  void send(std::uint32_t to, RoundMessage m);
  result<void> handle(std::uint32_t from, const RoundMessage& msg, TimePoint now);
  result<void> handle_part(std::uint32_t from, const PartMsg& m);
  result<void> handle_result(std::uint32_t from, const ResultMsg& m);
  result<void> handle_fin(std::uint32_t from, const FinMsg& m);
  result<void> check_floats(std::span<const float> d, std::uint64_t want, const char* what) const;
  result<void> buffer_future(std::uint32_t from, const RoundMessage& msg);
  void tally(const Sub& s, const Bitset& missing);
  result<void> check_report(const FinReport& r) const;
  std::string who(std::uint32_t m) const;

  std::vector<RoundMember> members_;
  // Weight each sender's parts carried (NaN: no part from it yet); reductions use these.
  std::vector<double> sent_weight_;
  bool local_pending_ = false;
  mutable bool output_touched_ =
      false;  // a result was written into output_ or a span of it handed out
  std::vector<Capacity> caps_;
  std::uint32_t self_;
  std::uint32_t n_;
  std::span<const float> local_;
  std::span<float> output_;
  RoundConfig cfg_;
  TimePoint deadline_;
  Status status_ = Status::running;
  Error error_;
  Bitset failed_;
  Bitset blamed_;
  Bitset closed_;  // peers whose streams ended cleanly (on_peer_closed)
  std::vector<TimePoint> last_activity_;
  Sub sub_;
  std::vector<Buffered> future_;
  // Per peer: what it sent ahead for the next sub-round (see held_bytes()).
  struct Ahead {
    std::uint64_t part_floats = 0, result_floats = 0;
    std::vector<std::uint32_t> parts, results;  // indices seen (sorted)
    Bitset fins = Bitset(2);                    // stage 1, stage 2
  };
  std::vector<Ahead> ahead_;
  std::size_t held_bytes_ = 0;
  std::vector<Envelope> outbox_;
  FloatBuffer* owned_ = nullptr;  // during on_message()
  std::vector<ReduceJob> jobs_;
  std::vector<std::uint64_t> counted_elems_;
  std::vector<Coverage> coverage_;
  RoundTimings timings_;
};

}  // namespace starling::averaging
