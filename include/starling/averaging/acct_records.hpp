// Accusations as DHT records (issue 20 item 2, bans): each accusation is one value in the
// dictionary of the run's accusation key (sub-key: the accuser's key and the evidence's hash),
// so every peer of the run reads every accusation and judges it itself with its BanList.
// A record is at most kMaxAccusationRecord bytes (under the DHT's value limit): larger
// evidence (false_report over big parts) goes to the group directly.
//
// Threading rule: call from the owning node's executor (as the Directory).
#pragma once

#include <string>

#include "starling/averaging/ban_list.hpp"
#include "starling/averaging/directory.hpp"

namespace starling::averaging::acct {

constexpr std::size_t kMaxAccusationRecord = 240 << 10;

Bytes accusation_key(const std::string& run_id);

// Errors: errc::too_large over the record limit, or the directory's error.
awaitable<result<void>> publish_accusation(Directory& dir, const std::string& run_id,
                                           const Accusation& a, WallTime expires);

struct CollectStats {
  std::size_t records = 0;    // values read
  std::size_t malformed = 0;  // did not decode
  std::size_t rejected = 0;   // bad signature or false evidence (the accuser is then banned)
  std::size_t verified = 0;   // evidence verified (new this call)
};
// Reads the run's accusations and feeds each new one to `bans`.
awaitable<result<CollectStats>> collect_accusations(Directory& dir, const std::string& run_id,
                                                    BanList& bans, TimePoint now);

}  // namespace starling::averaging::acct
