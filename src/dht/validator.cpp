#include "starling/dht/validator.hpp"

#include <algorithm>
#include <mutex>

#include "starling/core/fifo_map.hpp"
#include "starling/crypto/keys.hpp"
#include "starling/dht/signing.hpp"

namespace starling::dht {

struct OwnerSignatureValidator::Memory {
  std::mutex mutex;
  FifoMap<crypto::Sha256, bool> verified{kVerifiedMemory};
  std::uint64_t verifications = 0, remembered = 0;
};

OwnerSignatureValidator::OwnerSignatureValidator() : memory_(std::make_unique<Memory>()) {}
OwnerSignatureValidator::~OwnerSignatureValidator() = default;

std::uint64_t OwnerSignatureValidator::verifications() const {
  std::lock_guard lk(memory_->mutex);
  return memory_->verifications;
}

std::uint64_t OwnerSignatureValidator::remembered() const {
  std::lock_guard lk(memory_->mutex);
  return memory_->remembered;
}

ValidatorChain ValidatorChain::standard(const WireLimits& limits) {
  ValidatorChain c;
  c.add(std::make_shared<MaxSizeValidator>(limits.max_key_bytes, limits.max_subkey_bytes,
                                           limits.max_value_bytes));
  c.add(std::make_shared<OwnerSignatureValidator>());
  return c;
}

ValidatorChain& ValidatorChain::add(ValidatorPtr v) {
  if (v) chain_.push_back(std::move(v));
  return *this;
}

result<void> ValidatorChain::validate(const RecordKey& key, Record& record,
                                      const ValidationContext& ctx) const {
  if (record.ttl.count() <= 0)
    return make_error(dht_errc::expired, "record for key " + key.to_string() + " has no ttl left");
  for (const auto& v : chain_) {
    auto r = v->validate(key, record, ctx);
    if (!r) return r.error().with_context(v->name() + " validator, key " + key.to_string());
    if (record.ttl.count() <= 0)
      return make_error(dht_errc::expired,
                        v->name() + " validator left no ttl for key " + key.to_string());
  }
  return success();
}

result<void> MaxSizeValidator::validate(const RecordKey& key, Record& record,
                                        const ValidationContext&) const {
  if (key.raw().size() > max_key_)
    return make_error(errc::too_large, "key of " + std::to_string(key.raw().size()) +
                                           " bytes (max " + std::to_string(max_key_) + ")");
  if (record.subkey && record.subkey->raw().size() > max_subkey_)
    return make_error(errc::too_large, "sub-key of " + std::to_string(record.subkey->raw().size()) +
                                           " bytes (max " + std::to_string(max_subkey_) + ")");
  if (record.body.value.size() > max_value_)
    return make_error(errc::too_large, "value of " + std::to_string(record.body.value.size()) +
                                           " bytes (max " + std::to_string(max_value_) + ")");
  return success();
}

result<void> OwnerSignatureValidator::validate(const RecordKey& key, Record& record,
                                               const ValidationContext& ctx) const {
  ST_TRY(auto owners, owners_in(key.raw()));
  if (record.subkey) {
    ST_TRY(auto sub_owners, owners_in(record.subkey->raw()));
    for (auto& o : sub_owners)
      if (std::find(owners.begin(), owners.end(), o) == owners.end())
        owners.push_back(std::move(o));
  }
  const RecordBody& body = record.body;
  if (owners.empty()) {
    if (!body.signature.empty()) return make_error(dht_errc::unexpected_signature);
    return success();
  }
  if (owners.size() > 1)
    return make_error(dht_errc::multiple_owners,
                      owners[0].short_string() + " and " + owners[1].short_string());
  const auto& owner = owners.front();
  if (body.signature.empty())
    return make_error(dht_errc::missing_signature, "owner " + owner.short_string());
  if (body.lifetime.count() <= 0)
    return make_error(dht_errc::signature_window, "signed lifetime is zero");
  auto pk = owner.public_key();  // owners_in checked it is an inlined Ed25519 key
  if (!pk) return make_error(dht_errc::bad_signature, "owner " + owner.short_string());
  const Bytes payload = signing_payload(key, record.subkey, body);
  // What the memory is keyed on: everything the verification reads, length-prefixed.
  Bytes seen;
  const auto put = [&seen](BytesView b) {
    const auto n = static_cast<std::uint32_t>(b.size());
    for (int i = 0; i < 4; ++i) seen.push_back(static_cast<std::uint8_t>(n >> (8 * i)));
    seen.insert(seen.end(), b.begin(), b.end());
  };
  put(pk->data());
  put(body.signature);
  put(payload);
  const crypto::Sha256 digest = crypto::sha256(seen);
  bool known = false;
  {
    std::lock_guard lk(memory_->mutex);
    known = memory_->verified.count(digest) != 0;
    if (known) ++memory_->remembered;
  }
  if (!known) {
    if (!pk->verify(payload, body.signature))
      return make_error(dht_errc::bad_signature, "owner " + owner.short_string());
    std::lock_guard lk(memory_->mutex);
    ++memory_->verifications;
    memory_->verified.try_emplace(digest, true);
  }

  // The coarse wall-clock window (see signing.hpp). Everything in microseconds; versions and
  // lifetimes above 2^62 are rejected by the decoder, so nothing here overflows.
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  const std::int64_t now = wall_micros(ctx.wall);
  const std::int64_t skew = duration_cast<microseconds>(ctx.max_clock_skew).count();
  const std::int64_t lifetime = duration_cast<microseconds>(body.lifetime).count();
  if (body.version > (std::uint64_t{1} << 62) || lifetime > (std::int64_t{1} << 61))
    return make_error(dht_errc::signature_window, "signed version or lifetime out of range");
  const auto version = static_cast<std::int64_t>(body.version);
  if (version > now + skew)
    return make_error(dht_errc::signature_window,
                      "signed " + std::to_string((version - now) / 1000000) +
                          " s in the future (max skew " +
                          std::to_string(ctx.max_clock_skew.count() / 1000) + " s)");
  const std::int64_t end = version + lifetime + skew;
  if (end <= now)
    return make_error(dht_errc::signature_window, "signed lifetime ended " +
                                                      std::to_string((now - end) / 1000000) +
                                                      " s ago (replayed record?)");
  const Millis left = duration_cast<Millis>(microseconds(end - now));
  if (record.ttl > left) record.ttl = left;
  return success();
}

SchemaValidator::SchemaValidator(std::vector<Rule> rules, bool reject_unmatched)
    : rules_(std::move(rules)), reject_unmatched_(reject_unmatched) {
  std::stable_sort(rules_.begin(), rules_.end(),
                   [](const Rule& a, const Rule& b) { return a.prefix.size() > b.prefix.size(); });
}

result<void> SchemaValidator::validate(const RecordKey& key, Record& record,
                                       const ValidationContext&) const {
  const std::string_view k = as_string(key.raw());
  const Rule* rule = nullptr;
  for (const auto& r : rules_)
    if (k.substr(0, r.prefix.size()) == r.prefix) {
      rule = &r;
      break;
    }
  if (!rule) {
    if (reject_unmatched_) return make_error(dht_errc::schema, "no schema for this key");
    return success();
  }
  if (rule->shape == Shape::plain && record.subkey)
    return make_error(dht_errc::schema, "keys under \"" + rule->prefix + "\" take no sub-keys");
  if (rule->shape == Shape::dictionary && !record.subkey)
    return make_error(dht_errc::schema, "keys under \"" + rule->prefix + "\" need a sub-key");
  if (record.body.value.size() > rule->max_value_bytes)
    return make_error(dht_errc::schema, "value of " + std::to_string(record.body.value.size()) +
                                            " bytes above the schema's " +
                                            std::to_string(rule->max_value_bytes));
  if (rule->max_ttl.count() > 0 && record.ttl > rule->max_ttl) record.ttl = rule->max_ttl;
  if (rule->check) {
    auto r = rule->check(record);
    if (!r) return make_error(dht_errc::schema, r.error().message());
  }
  return success();
}

}  // namespace starling::dht
