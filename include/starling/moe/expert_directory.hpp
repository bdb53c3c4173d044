// ExpertDirectory: expert declarations in the DHT (through the averaging::Directory seam:
// DhtDirectory on the Kademlia DHT, MemoryDirectory / FileDirectory in tests) and the
// networked side of beam search.
//
// Layout: for uid ffn.3.17 served by peer P, the key "moe/ffn." holds sub-key "3@P" and the
// key "moe/ffn.3." holds sub-key "17@P" (leaf), each value an ExpertDeclaration (coordinate,
// P, P's addresses); the key "moe/ffn.3.17" holds sub-key "P". Several servers of one uid
// (replicas) each own their sub-keys. Declarations live `ttl` (about 2x the refresh period),
// so a dead server's experts vanish within one ttl.
//
// Lookups are cached for `cache_ttl` (one refresh period: a re-declared expert is hidden at
// most that long); failed lookups are not cached.
//
// Threading rule: call from the node's executor (as the Directory).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "starling/averaging/directory.hpp"
#include "starling/moe/beam_search.hpp"
#include "starling/moe/uid.hpp"
#include "starling/moe/wire.hpp"

namespace starling::moe {

// An alive expert and who serves it.
struct ExpertEndpoint {
  std::string uid;
  std::vector<Declaration> servers;  // replicas (at least one)
  float score = 0;                   // the sample's score (beam search only)
};

class ExpertDirectory {
 public:
  ExpertDirectory(std::shared_ptr<averaging::Directory> dir, Duration cache_ttl = 5s)
      : dir_(std::move(dir)), cache_ttl_(cache_ttl) {}

  // Declares every uid (and all its prefixes) as served by `self` until now + ttl.
  // Fails with the first put error (the others are still tried).
  awaitable<result<void>> declare(std::vector<ExpertUid> uids, Declaration self, Duration ttl);

  // The declarations under `prefix` ("ffn.3."), cached. Garbage values are skipped.
  awaitable<result<std::vector<Declaration>>> lookup_prefix(std::string prefix);
  // The servers of one uid (not cached).
  awaitable<result<std::vector<Declaration>>> find_expert(std::string uid);

  // For each sample, its `k` best alive experts (beam_search.hpp), with their servers. The
  // prefix lookups of one round run in parallel; `timeout` bounds the whole search (the
  // samples not finished by then keep what they found).
  awaitable<result<std::vector<std::vector<ExpertEndpoint>>>> beam_search(
      std::string grid, std::vector<std::vector<std::vector<float>>> scores, std::size_t k,
      Duration timeout);

  void clear_cache() { cache_.clear(); }
  std::uint64_t lookups() const noexcept { return lookups_; }

 private:
  struct CacheEntry {
    TimePoint fetched;
    std::vector<Declaration> decls;
  };
  std::shared_ptr<averaging::Directory> dir_;
  Duration cache_ttl_;
  std::map<std::string, CacheEntry> cache_;
  std::uint64_t lookups_ = 0;
};

// The DHT key of a prefix or uid.
Bytes directory_key(const std::string& prefix_or_uid);

}  // namespace starling::moe
