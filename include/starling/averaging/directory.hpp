// Directory: the seam between averaging and the DHT. Matchmaking and state transfer store small
// signed-by-transport values in a dictionary key -> {sub-key -> value} with per-value expiry,
// and read the live values back. The real implementation sits on the Kademlia DHT
// (dictionary values with sub-keys); MemoryDirectory (one process, tests) and FileDirectory
// (processes on one machine: multi-process tests and benchmarks) are the doubles.
//
// Threading rule: call from the owning node's executor. MemoryDirectory and FileDirectory may
// be shared by several nodes (they lock internally) and complete without waiting.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "starling/averaging/matchmaking_core.hpp"
#include "starling/core/async.hpp"

namespace starling::averaging {

class Directory {
 public:
  virtual ~Directory() = default;
  // Stores `value` under (key, subkey) until `expires`, replacing the sub-key's older value.
  virtual awaitable<result<void>> put(Bytes key, Bytes subkey, Bytes value, WallTime expires) = 0;
  // The unexpired values under `key`, in any order.
  virtual awaitable<result<std::vector<Bytes>>> get(Bytes key) = 0;
};

class MemoryDirectory final : public Directory {
 public:
  awaitable<result<void>> put(Bytes key, Bytes subkey, Bytes value, WallTime expires) override;
  awaitable<result<std::vector<Bytes>>> get(Bytes key) override;

 private:
  struct Item {
    Bytes value;
    WallTime expires;
  };
  std::mutex mu_;
  std::map<Bytes, std::map<Bytes, Item>> data_;
};

// One file per (key, sub-key) under `root` (written atomically by rename); for several
// processes on one machine.
class FileDirectory final : public Directory {
 public:
  explicit FileDirectory(std::filesystem::path root) : root_(std::move(root)) {}
  awaitable<result<void>> put(Bytes key, Bytes subkey, Bytes value, WallTime expires) override;
  awaitable<result<std::vector<Bytes>>> get(Bytes key) override;

 private:
  std::filesystem::path root_;
};

}  // namespace starling::averaging
