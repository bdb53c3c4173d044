// RoundCore: messages for the next sub-round, held until it starts and bounded per peer by
// what it could legitimately send in one sub-round (see RoundCore::held_bytes()).
#include <algorithm>

#include "starling/averaging/round_core.hpp"

namespace starling::averaging {

namespace {
// Records index `i` in the sorted list `seen`; false if it was there already.
bool insert_once(std::vector<std::uint32_t>& seen, std::uint32_t i) {
  auto it = std::lower_bound(seen.begin(), seen.end(), i);
  if (it != seen.end() && *it == i) return false;
  seen.insert(it, i);
  return true;
}
std::size_t report_bytes(const FinReport& r) {
  return sizeof(FinReport) +
         (r.missing.size() + r.failed.size() + r.blamed.size() + r.counted.size() + 7) / 8;
}
}  // namespace

std::size_t RoundCore::held_per_message() noexcept {
  return sizeof(Buffered);
}

result<void> RoundCore::buffer_future(std::uint32_t from, const RoundMessage& msg) {
  if (ahead_.empty()) ahead_.resize(n_);
  Ahead& a = ahead_[from];
  const std::uint64_t n = output_.size();
  Buffered b;
  b.from = from;
  b.msg = msg;
  std::size_t bytes = sizeof(Buffered);
  if (auto* p = std::get_if<PartMsg>(&b.msg)) {
    if (p->data.empty() || !insert_once(a.parts, p->part))
      return make_error(errc::protocol_violation, "empty or repeated part for the next sub-round");
    if ((a.part_floats += p->data.size()) > n)
      return make_error(errc::too_large, "more parts than the vector for the next sub-round");
    b.data.assign(p->data.begin(), p->data.end());
    p->data = b.data;
  } else if (auto* r = std::get_if<ResultMsg>(&b.msg)) {
    if (r->data.empty() || !insert_once(a.results, r->part))
      return make_error(errc::protocol_violation,
                        "empty or repeated result for the next sub-round");
    if ((a.result_floats += r->data.size()) > n)
      return make_error(errc::too_large, "more results than the vector for the next sub-round");
    b.data.assign(r->data.begin(), r->data.end());
    r->data = b.data;
    bytes += (r->counted.size() + 7) / 8;
  } else if (auto* f = std::get_if<FinMsg>(&b.msg)) {
    if (f->stage < 1 || f->stage > 2 || a.fins.test(f->stage - 1u))
      return make_error(errc::protocol_violation, "repeated fin for the next sub-round");
    if (f->reports.size() > n_) return make_error(errc::too_large, "fin with too many reports");
    a.fins.set(f->stage - 1u);
    for (const auto& rep : f->reports) bytes += report_bytes(rep);
  }
  bytes += b.data.size() * sizeof(float);
  held_bytes_ += bytes;
  future_.push_back(std::move(b));
  return success();
}

}  // namespace starling::averaging
