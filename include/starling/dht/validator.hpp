// Record validation: a configurable chain of validators that every record passes before it
// is stored, returned to a caller or forwarded (stores, get results, caching, republishing).
// A rejected record is dropped with the reason; it is never stored or forwarded.
//
// Threading rule: validators are immutable after construction and may be shared between
// nodes and threads.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "starling/dht/config.hpp"
#include "starling/dht/error.hpp"
#include "starling/dht/record.hpp"

namespace starling::dht {

struct ValidationContext {
  WallTime wall;  // the local wall clock (for the signature window only)
  Millis max_clock_skew{std::chrono::minutes(10)};
};

class Validator {
 public:
  virtual ~Validator() = default;
  virtual std::string name() const = 0;
  // Checks `record` stored under `key`. May lower record.ttl (never raise it) and changes
  // nothing else. Errors carry a dht_errc or errc and the reason.
  virtual result<void> validate(const RecordKey& key, Record& record,
                                const ValidationContext& ctx) const = 0;
};

using ValidatorPtr = std::shared_ptr<const Validator>;

// Runs the built-in checks (ttl > 0, else dht_errc::expired) and then each validator in order;
// the first error wins.
class ValidatorChain {
 public:
  ValidatorChain() = default;
  // Size limits from `limits` plus owner signatures: what every node should run.
  static ValidatorChain standard(const WireLimits& limits = {});

  ValidatorChain& add(ValidatorPtr v);
  result<void> validate(const RecordKey& key, Record& record, const ValidationContext& ctx) const;
  std::size_t size() const noexcept { return chain_.size(); }

 private:
  std::vector<ValidatorPtr> chain_;
};

// Rejects keys, sub-keys and values above the given sizes (errc::too_large).
class MaxSizeValidator final : public Validator {
 public:
  MaxSizeValidator(std::size_t max_key, std::size_t max_subkey, std::size_t max_value)
      : max_key_(max_key), max_subkey_(max_subkey), max_value_(max_value) {}
  std::string name() const override { return "max-size"; }
  result<void> validate(const RecordKey& key, Record& record,
                        const ValidationContext& ctx) const override;

 private:
  std::size_t max_key_, max_subkey_, max_value_;
};

// Owned keys and sub-keys (see signing.hpp): requires the owner's valid signature inside the
// signing window and cuts the ttl to the window's end; rejects signatures on unowned records.
// A node meets the same signed record many times (every node of a get answers with it, and a
// record it stored comes back in its own gets): the SHA-256 of each (owner, signature, signed
// bytes) that verified is remembered (the last kVerifiedMemory), so a repeat skips the Ed25519
// verification (~50 us); the signing window is checked every time. The memory is the only
// mutable state (behind a mutex: validators may be shared between threads).
class OwnerSignatureValidator final : public Validator {
 public:
  static constexpr std::size_t kVerifiedMemory = 4096;
  OwnerSignatureValidator();
  ~OwnerSignatureValidator() override;
  std::string name() const override { return "owner-signature"; }
  result<void> validate(const RecordKey& key, Record& record,
                        const ValidationContext& ctx) const override;
  // Signatures verified with Ed25519 / found in the memory (tests, benchmarks).
  std::uint64_t verifications() const;
  std::uint64_t remembered() const;

 private:
  struct Memory;
  std::unique_ptr<Memory> memory_;
};

// Per key prefix: the value shape (plain, dictionary or either), a maximum value size, a
// maximum ttl (longer ttls are cut) and an optional check of the record. The longest
// matching prefix applies. With `reject_unmatched`, keys no rule matches are rejected
// (an allow-list of key spaces).
class SchemaValidator final : public Validator {
 public:
  enum class Shape { any, plain, dictionary };
  struct Rule {
    std::string prefix;
    Shape shape = Shape::any;
    std::size_t max_value_bytes = SIZE_MAX;
    Millis max_ttl{0};  // 0 = no limit
    std::function<result<void>(const Record&)> check;
  };
  explicit SchemaValidator(std::vector<Rule> rules, bool reject_unmatched = false);
  std::string name() const override { return "schema"; }
  result<void> validate(const RecordKey& key, Record& record,
                        const ValidationContext& ctx) const override;

 private:
  std::vector<Rule> rules_;  // longest prefix first
  bool reject_unmatched_;
};

}  // namespace starling::dht
