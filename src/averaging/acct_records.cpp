// Accusations as DHT records (acct_records.hpp).
#include "starling/averaging/acct_records.hpp"

#include "starling/averaging/schema.hpp"
#include "starling/core/log.hpp"

namespace starling::averaging::acct {

Bytes accusation_key(const std::string& run_id) {
  return blake2b_256(as_bytes("starling/acct/accusations/" + run_id));
}

awaitable<result<void>> publish_accusation(Directory& dir, const std::string& run_id,
                                           const Accusation& a, WallTime expires) {
  Bytes value = encode(a);
  if (value.size() > kMaxAccusationRecord)
    co_return make_error(errc::too_large, "accusation record over " +
                                              std::to_string(kMaxAccusationRecord) + " bytes");
  Bytes subkey(a.accuser.begin(), a.accuser.end());
  const Bytes h = blake2b_256(value);
  subkey.insert(subkey.end(), h.begin(), h.end());
  Bytes key = accusation_key(run_id);
  auto r = co_await dir.put(std::move(key), std::move(subkey), std::move(value), expires);
  co_return r;
}

awaitable<result<CollectStats>> collect_accusations(Directory& dir, const std::string& run_id,
                                                    BanList& bans, TimePoint now) {
  Bytes key = accusation_key(run_id);
  auto values = co_await dir.get(std::move(key));
  if (!values) co_return values.error();
  CollectStats st;
  for (const Bytes& v : values.value()) {
    ++st.records;
    auto a = decode_accusation(v);
    if (!a) {
      ++st.malformed;
      logger("averaging")->info("accusation record dropped: {}", a.error().message());
      continue;
    }
    if (bans.seen(a.value())) continue;
    if (bans.add_accusation(a.value(), now))
      ++st.verified;
    else
      ++st.rejected;
  }
  co_return st;
}

}  // namespace starling::averaging::acct
