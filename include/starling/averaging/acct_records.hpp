// Accusations as DHT records (issue 20 item 2, bans): each accusation is one value in the
// dictionary of the run's accusation key (sub-key: the accuser's key and the evidence's hash),
// so every peer of the run reads every accusation and judges it itself with its BanList.
// A record is at most kMaxAccusationRecord bytes (under the DHT's value limit). Larger evidence
// (false_report over parts above ~30k values) is published detached: its values go in
// content-addressed chunk records (key chunk_key(run, BLAKE2b of the chunk), at most
// kChunkBytes each) and the accusation record carries the accusation without its values plus
// the chunks' hashes. A reader fetches the chunks, keeps a value only if its hash matches, and
// judges the reassembled accusation like any other (the accuser's signature covers the
// values); one whose chunks are not readable yet is left for the next read.
//
// Threading rule: call from the owning node's executor (as the Directory).
#pragma once

#include <string>

#include "starling/averaging/ban_list.hpp"
#include "starling/averaging/directory.hpp"
#include "starling/averaging/peer_gate.hpp"

namespace starling::averaging::acct {

constexpr std::size_t kMaxAccusationRecord = 240 << 10;
constexpr std::size_t kChunkBytes = 192 << 10;
// Detached accusations whose chunks one read fetches at most, and at most per accuser: those
// of accused peers (their false_report answers) first, the rest in random order (records that
// never complete cannot make every read expensive, and one accuser's junk cannot crowd out the
// others'; the rest wait for a later read).
constexpr std::size_t kMaxDetachedPerRead = 16;
constexpr std::size_t kMaxDetachedPerAccuser = 2;

Bytes accusation_key(const std::string& run_id);
Bytes chunk_key(const std::string& run_id, const Hash32& chunk);

struct DetachedAccusation {
  Accusation stripped;  // evidence.data and data2 empty
  std::uint32_t floats1 = 0, floats2 = 0;
  std::vector<Hash32> chunks1, chunks2;  // of data, of data2
  friend bool operator==(const DetachedAccusation&, const DetachedAccusation&) = default;
};
// The chunks of `v` (float32 little-endian, kChunkBytes each but the last).
std::vector<Bytes> chunks_of(std::span<const float> v);
DetachedAccusation detach(const Accusation& a);
Bytes encode(const DetachedAccusation& d);
// Errors: not a detached accusation, or chunk counts that do not fit the value counts.
result<DetachedAccusation> decode_detached(BytesView b);
// The accusation with its values put back from the chunks (in order); errors: a chunk is
// missing or does not match its hash.
result<Accusation> attach(const DetachedAccusation& d, const std::vector<Bytes>& chunks1,
                          const std::vector<Bytes>& chunks2);

// Errors: errc::too_large over the record limit, or the directory's error.
awaitable<result<void>> publish_accusation(Directory& dir, const std::string& run_id,
                                           const Accusation& a, WallTime expires);

struct CollectStats {
  std::size_t records = 0;     // values read
  std::size_t malformed = 0;   // did not decode
  std::size_t rejected = 0;    // bad signature or false evidence (the accuser is then banned)
  std::size_t verified = 0;    // evidence verified (new this call)
  std::size_t incomplete = 0;  // detached, some chunk not readable (yet)
  std::size_t refused = 0;     // the accuser is not admitted (a private run's non-member)
};
// Reads the run's accusations and feeds each new one to `bans`. With a gate (a private run),
// accusations by accusers it does not admit now are skipped (read again next time).
awaitable<result<CollectStats>> collect_accusations(Directory& dir, const std::string& run_id,
                                                    BanList& bans, TimePoint now,
                                                    PeerGate* gate = nullptr);

}  // namespace starling::averaging::acct
