#include "starling/dht/lookup.hpp"

namespace starling::dht {

Lookup::Lookup(DhtId target, std::size_t alpha, std::size_t beam, std::size_t max_candidates)
    : target_(target),
      alpha_(alpha ? alpha : 1),
      beam_(beam ? beam : 1),
      max_candidates_(max_candidates ? max_candidates : 8 * (beam ? beam : 1)) {}

void Lookup::add(Contact contact, std::size_t hop) {
  const DhtId d = contact.id ^ target_;
  if (by_distance_.count(d)) return;
  if (by_distance_.size() >= max_candidates_) {
    // Full: the newcomer must beat the farthest fresh candidate, which it then replaces.
    auto far = by_distance_.end();
    for (auto it = by_distance_.rbegin(); it != by_distance_.rend(); ++it)
      if (it->second.state == State::fresh) {
        far = std::prev(it.base());
        break;
      }
    if (far == by_distance_.end() || !(d < far->first)) return;
    by_distance_.erase(far);
  }
  by_distance_.emplace(d, Candidate{std::move(contact), State::fresh, hop});
}

void Lookup::set_state(Candidate& c, State s) {
  if (c.state == State::in_flight && c.dial) --dials_;
  if (c.state == State::in_flight) --in_flight_;
  if (c.state == State::slow) --slow_;
  c.state = s;
  if (s == State::in_flight) ++in_flight_;
  if (s == State::in_flight && c.dial) ++dials_;
  if (s == State::slow) ++slow_;
  if (s == State::responded) ++responded_;
  if (s == State::failed) ++failed_;
}

std::vector<Contact> Lookup::next(const Connected& connected, std::size_t max_dials) {
  std::vector<Contact> out;
  std::size_t usable = 0;
  for (auto& [d, c] : by_distance_) {
    if (in_flight_ >= alpha_ || usable >= beam_) break;
    if (c.state == State::failed || c.state == State::slow) continue;
    ++usable;
    if (c.state == State::fresh) {
      c.dial = connected && !connected(c.contact);
      if (c.dial && max_dials > 0 && dials_ >= max_dials) continue;  // waits for that dial
      set_state(c, State::in_flight);
      ++queried_;
      out.push_back(c.contact);
    }
  }
  return out;
}

Lookup::Candidate* Lookup::find_mut(const DhtId& id) {
  auto it = by_distance_.find(id ^ target_);
  return it == by_distance_.end() ? nullptr : &it->second;
}

const Lookup::Candidate* Lookup::find(const DhtId& id) const {
  auto it = by_distance_.find(id ^ target_);
  return it == by_distance_.end() ? nullptr : &it->second;
}

void Lookup::on_response(const DhtId& from, std::vector<Contact> peers) {
  Candidate* c = find_mut(from);
  if (!c || (c->state != State::in_flight && c->state != State::slow)) return;
  set_state(*c, State::responded);
  const std::size_t hop = c->hop + 1;
  for (auto& p : peers) add(std::move(p), hop);
}

void Lookup::on_failure(const DhtId& from) {
  Candidate* c = find_mut(from);
  if (!c || c->state == State::responded || c->state == State::failed) return;
  set_state(*c, State::failed);
}

void Lookup::on_slow(const DhtId& from) {
  Candidate* c = find_mut(from);
  if (c && c->state == State::in_flight) set_state(*c, State::slow);
}

bool Lookup::converged() const {
  // The beam closest usable candidates answered; slow ones are passed over, unless fewer than
  // a beam of candidates is known: then their answers may still bring closer nodes.
  std::size_t usable = 0;
  bool slow = false;
  for (const auto& [d, c] : by_distance_) {
    if (c.state == State::failed) continue;
    if (c.state == State::slow) {
      slow = true;
      continue;
    }
    if (c.state != State::responded) return false;
    if (++usable >= beam_) return true;
  }
  return !slow;
}

bool Lookup::idle() const {
  if (in_flight_ || slow_) return false;
  std::size_t usable = 0;
  for (const auto& [d, c] : by_distance_) {
    if (usable >= beam_) break;
    if (c.state == State::failed) continue;
    if (c.state == State::fresh) return false;
    ++usable;
  }
  return true;
}

std::size_t Lookup::rank(const DhtId& id) const {
  const DhtId d = id ^ target_;
  std::size_t n = 0;
  for (auto it = by_distance_.begin(); it != by_distance_.end() && it->first < d; ++it)
    if (it->second.state != State::failed) ++n;
  return n;
}

std::vector<Contact> Lookup::closest_responded(std::size_t n) const {
  std::vector<Contact> out;
  for (const auto& [d, c] : by_distance_) {
    if (out.size() >= n) break;
    if (c.state == State::responded) out.push_back(c.contact);
  }
  return out;
}

}  // namespace starling::dht
