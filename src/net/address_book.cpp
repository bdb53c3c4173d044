// AddressBook: bounded, ranked addresses per peer (see include/starling/net/address_book.hpp).
#include "starling/net/address_book.hpp"

#include <algorithm>

namespace starling::net {

const std::vector<Multiaddr>& AddressBook::add(const PeerId& peer,
                                               const std::vector<Multiaddr>& addrs,
                                               AddrSource source) {
  auto& p = book_[peer];
  const std::uint64_t batch = next_batch_++;
  // Within a batch the given order ranks, so past the first cap_ distinct addresses nothing
  // of it could stay: the rest is not even looked at.
  std::size_t taken = 0;
  for (const auto& a : addrs) {
    if (taken == cap_) break;
    auto it = std::find_if(p.entries.begin(), p.entries.end(),
                           [&](const Entry& e) { return e.addr == a; });
    if (it == p.entries.end()) {
      p.entries.push_back(Entry{a, source, batch, taken++});
      continue;
    }
    if (it->batch == batch) continue;  // listed twice in this batch
    if (source >= it->source) {
      it->source = source;
      it->batch = batch;
      it->index = taken++;
    }
  }
  std::stable_sort(p.entries.begin(), p.entries.end(), [](const Entry& x, const Entry& y) {
    if (x.source != y.source) return x.source > y.source;
    if (x.batch != y.batch) return x.batch > y.batch;
    return x.index < y.index;
  });
  if (p.entries.size() > cap_) p.entries.resize(cap_);
  p.view.clear();
  for (const auto& e : p.entries) p.view.push_back(e.addr);
  return p.view;
}

const std::vector<Multiaddr>& AddressBook::addrs(const PeerId& peer) const {
  static const std::vector<Multiaddr> kNone;
  auto it = book_.find(peer);
  return it == book_.end() ? kNone : it->second.view;
}

}  // namespace starling::net
