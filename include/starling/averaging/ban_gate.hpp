// A PeerGate that refuses peers the run's ban list has banned (accountability, ban_list.hpp),
// in front of another gate (a private run's membership) or of none (an open run). The state
// averager uses it: donors refuse banned peers' state requests and downloaders ignore banned
// donors' announcements, like everything else in the run.
//
// Threading rule: the averager's executor (the ban list's thread).
#pragma once

#include <memory>

#include "starling/averaging/ban_list.hpp"
#include "starling/averaging/peer_gate.hpp"

namespace starling::averaging {

std::shared_ptr<PeerGate> ban_gate(std::shared_ptr<const acct::BanList> bans,
                                   std::shared_ptr<PeerGate> inner);

}  // namespace starling::averaging
