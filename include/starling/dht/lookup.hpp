// The iterative lookup state machine (no I/O): candidates ordered by XOR distance to the
// target, at most `alpha` requests in flight, only the `beam` closest usable candidates ever
// queried. It converges when the `beam` closest candidates that did not fail have all
// answered. A request that is slow stops counting against alpha (its answer is still used),
// and a slow candidate is passed over for termination, so one dead node never stalls a
// lookup for the whole request timeout.
//
// Hops: nodes from our own table are hop 1; a node first learned from a hop-h answer is hop
// h + 1. The hop count of a result is the hop of the node that gave it.
//
// Threading rule: owned by one DhtCore; used from its thread only.
#pragma once

#include <functional>
#include <map>
#include <vector>

#include "starling/dht/id.hpp"

namespace starling::dht {

class Lookup {
 public:
  enum class State { fresh, in_flight, slow, responded, failed };
  struct Candidate {
    Contact contact;
    State state = State::fresh;
    std::size_t hop = 1;
    bool dial = false;  // its request needed a new connection
  };
  // Whether a candidate can be asked over a connection that is already open (the networked
  // node's hint; the simulation has none: every candidate is).
  using Connected = std::function<bool(const Contact&)>;

  Lookup(DhtId target, std::size_t alpha, std::size_t beam, std::size_t max_candidates = 0);

  const DhtId& target() const noexcept { return target_; }
  // Adds a candidate learned at `hop` (ignored if already known or hopelessly far).
  void add(Contact contact, std::size_t hop);
  // The candidates to query now (marked in flight): the closest fresh ones inside the beam,
  // up to alpha requests in flight. With `connected` and `max_dials` > 0, at most that many
  // requests that need a new connection are in flight (not slow) at once: the others wait,
  // and their alpha slots go to connected candidates further down the beam.
  std::vector<Contact> next(const Connected& connected = {}, std::size_t max_dials = 0);
  // `from` answered with `peers` (added at its hop + 1).
  void on_response(const DhtId& from, std::vector<Contact> peers);
  void on_failure(const DhtId& from);
  void on_slow(const DhtId& from);
  // Converged: the beam closest usable candidates have all answered.
  bool converged() const;
  // Nothing is in flight (not even slow) and nothing is left to query.
  bool idle() const;
  std::size_t in_flight() const noexcept { return in_flight_; }
  std::size_t dials_in_flight() const noexcept { return dials_; }

  // The `n` closest candidates that answered, closest first.
  std::vector<Contact> closest_responded(std::size_t n) const;
  const Candidate* find(const DhtId& id) const;
  // How many candidates that did not fail are closer to the target than `id`.
  std::size_t rank(const DhtId& id) const;
  std::size_t responded() const noexcept { return responded_; }
  std::size_t failed() const noexcept { return failed_; }
  std::size_t queried() const noexcept { return queried_; }

 private:
  Candidate* find_mut(const DhtId& id);
  void set_state(Candidate& c, State s);

  DhtId target_;
  std::size_t alpha_, beam_, max_candidates_;
  std::map<DhtId, Candidate> by_distance_;  // key: id ^ target
  std::size_t in_flight_ = 0;               // in flight and not slow
  std::size_t slow_ = 0;
  std::size_t dials_ = 0;  // in flight (not slow) and needing a new connection
  std::size_t responded_ = 0, failed_ = 0, queried_ = 0;
};

}  // namespace starling::dht
