// MembershipService: a private run's membership on the DHT, and the averaging::PeerGate that
// admits only its members.
//
// - Each member publishes its certificate in the run's members dictionary (DHT key
//   BLAKE2b("starling/run/members/" + hex(run key)), a sub-key it owns, so the record is signed
//   by the member's identity key: the certificate's member must be the record's signer).
// - Every member re-reads that dictionary and the run's revocation lists (DHT key
//   BLAKE2b("starling/run/revocations/" + hex(run key)), one owned sub-key per publisher; the
//   highest sequence that verifies wins) every poll_interval, and republishes its certificate
//   and the newest list it knows every record_ttl / 3, so a revocation outlives its publisher.
// - admit(peer) answers at once for a known peer; for an unknown one it reads the dictionary
//   first (at most once per lookup_interval across every caller, each caller bounded by
//   lookup_timeout), so a newcomer is admitted as soon as its certificate is in the DHT.
//   admits(peer) never waits (an unknown peer starts a background lookup).
// A revoked member is refused everywhere within poll_interval (+ one lookup) of the list
// reaching the DHT.
//
// Threading rule: the DHT node's executor (the host's io thread), except start() and
// membership().
#pragma once

#include <memory>

#include "starling/auth/membership.hpp"
#include "starling/averaging/peer_gate.hpp"
#include "starling/dht/node.hpp"

namespace starling::auth {

struct MembershipConfig {
  Key32 run_key{};  // the run authority's public key
  // This peer's certificate (encoded); must be valid for it now. Empty: an observer (a
  // monitor) that reads the members and revocations but publishes nothing.
  Bytes certificate;
  Bytes revocations;  // optional: a signed revocation list to start from (published too)
  Duration poll_interval = 30s;
  Duration lookup_interval = 1s;
  Duration lookup_timeout = 5s;
  Duration record_ttl = 600s;
};

// The config from a run key's text form (parse_run_key), a certificate file and an optional
// revocation list file ("": none); files above 1 MiB are refused. Errors name the file.
result<MembershipConfig> membership_from_files(std::string_view run_key,
                                               const std::string& certificate,
                                               const std::string& revocations);

dht::RecordKey members_key(const Key32& run_key);
dht::RecordKey revocations_key(const Key32& run_key);

class MembershipService final : public averaging::PeerGate,
                                public std::enable_shared_from_this<MembershipService> {
 public:
  // Checks the own certificate (errc::permission naming the refusal) and the initial list.
  static result<std::shared_ptr<MembershipService>> create(std::shared_ptr<dht::DhtNode> node,
                                                           MembershipConfig cfg);
  ~MembershipService() override;

  // Any thread: (on the executor) publishes the own certificate (and list), reads the
  // members, then keeps polling until stop().
  void start();
  awaitable<void> stop();  // executor; bounded

  bool admits(const net::PeerId& peer) override;
  awaitable<bool> admit(const net::PeerId& peer) override;

  // One read of the members dictionary and the revocation lists.
  awaitable<result<void>> refresh();
  // Installs `list` (if newer than the one known) and stores it in the DHT.
  awaitable<result<void>> publish_revocations(Bytes list);

  const std::shared_ptr<Membership>& membership() const noexcept { return members_; }
  struct Stats {
    std::uint64_t refreshes = 0;  // reads of the dictionary (polls and lookups)
    std::uint64_t lookups = 0;    // of them, started for an unknown peer
    std::uint64_t refused = 0;    // admits()/admit() answers "no"
  };
  const Stats& stats() const noexcept { return stats_; }

 private:
  MembershipService(std::shared_ptr<dht::DhtNode> node, MembershipConfig cfg);
  awaitable<result<void>> publish_own();
  awaitable<void> refresh_task();
  void start_lookup();
  static awaitable<void> run(std::weak_ptr<MembershipService> weak);
  std::uint64_t now() const;

  std::shared_ptr<dht::DhtNode> node_;
  MembershipConfig cfg_;
  std::shared_ptr<Membership> members_;
  dht::RecordKey members_key_, revocations_key_;
  TaskScope scope_;
  AsyncEvent refreshed_;      // pulsed when a refresh ends
  int refreshing_count_ = 0;  // reads in flight (admit() waits for them)
  bool stopped_ = false, told_revoked_ = false;
  TimePoint last_lookup_{};
  Stats stats_;
};

}  // namespace starling::auth
