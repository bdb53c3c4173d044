// PeerGate: who may take part in an averager's matchmaking, rounds and state transfer. An open
// run has none (everyone may); a private run's gate admits only members holding a valid
// certificate (auth::MembershipService). The averager asks it where a peer first shows up:
// directory entries (matchmaking entries, state announcements), join requests, the members of
// a formed group, state requests.
//
// Threading rule: called on the averager's executor.
#pragma once

#include "starling/core/async.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::averaging {

class PeerGate {
 public:
  virtual ~PeerGate() = default;
  // From what is known now, without waiting. A peer not known yet is refused (the gate may
  // look it up in the background for the next question).
  virtual bool admits(const net::PeerId& peer) = 0;
  // May first look an unknown peer up (bounded by the gate's own deadline).
  virtual awaitable<bool> admit(const net::PeerId& peer) = 0;
};

}  // namespace starling::averaging
