// Choosing among the replicas of an expert (several servers declaring one uid) by measured
// throughput and latency: an expected-finish-time choice, as SWARM's trainers do.
//
// Every server has a cost model fitted to the forward calls made to it: the time of a call of
// n rows is about latency + n * per_row, fitted by exponentially weighted least squares over
// (rows, elapsed) of its calls (weight `alpha` for the newest). When every call had the same
// rows the slope is unknown and the cost is the weighted mean time. A server not measured
// (or not measured for `forget_after`, so a replica that was slow is tried again) is priced
// at the best measured server's cost (1 ms per call when none is measured) and wins ties, so
// it gets tried.
//
// A forward plans its calls with begin() and one choose() per expert: every server has a
// queue that starts empty at begin(); choose() gives the expert to the replica whose queue
// plus the call's expected time ends first, and appends the call to that queue (one server
// runs its batches one after another). A server whose call for that expert failed or came
// late within `avoid_failed` is chosen last, and one whose call for another expert did is
// chosen only when no replica without a recent failure is left (a dead server fails every
// expert it serves).
//
// Threading: not thread-safe; one trainer's forward (its training thread) owns it. Time is
// passed in, so tests can drive it with virtual time.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "starling/core/clock.hpp"

namespace starling::moe {

struct ReplicaChoiceOptions {
  double alpha = 0.25;             // weight of the newest call in the fit
  Duration forget_after = 60s;     // a server not measured for this long is unmeasured again
  Duration avoid_failed = 10s;     // a failed (uid, server) is avoided this long
  Duration unmeasured_cost = 1ms;  // price of a call when no server is measured
};

class ReplicaChooser {
 public:
  explicit ReplicaChooser(ReplicaChoiceOptions options = {}) : options_(options) {}

  // Starts planning a forward: empties every queue, drops old failures and measurements.
  void begin(TimePoint now);
  // Index into `servers` (peer ids as strings, not empty) of the replica that should run a
  // call of `rows` rows of expert `uid`; queues the call there.
  std::size_t choose(const std::string& uid, const std::vector<std::string>& servers,
                     std::size_t rows);
  // A call of `rows` rows to `server` took `elapsed` (ended at `now`).
  void observe(const std::string& server, std::size_t rows, Duration elapsed, TimePoint now);
  // The call of `uid` to `server` failed or was late at `now`.
  void failed(const std::string& uid, const std::string& server, TimePoint now);

  // The expected time of a call of `rows` rows to `server` (the unmeasured price if it was
  // never measured).
  Duration expected(const std::string& server, std::size_t rows) const;
  bool measured(const std::string& server) const { return models_.count(server) > 0; }

 private:
  struct Model {
    // Weighted means of rows, seconds, rows^2 and rows*seconds.
    double x = 0, y = 0, xx = 0, xy = 0;
    TimePoint last{};
    double seconds(std::size_t rows) const;
  };
  Duration unmeasured(std::size_t rows) const;

  ReplicaChoiceOptions options_;
  std::map<std::string, Model> models_;
  std::map<std::string, Duration> queue_;  // the plan of the current forward
  std::map<std::pair<std::string, std::string>, TimePoint> failed_;  // (uid, server)
  std::map<std::string, TimePoint> failed_servers_;
  TimePoint now_{};
};

}  // namespace starling::moe
