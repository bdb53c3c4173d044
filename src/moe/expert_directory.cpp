// ExpertDirectory (see expert_directory.hpp).
#include "starling/moe/expert_directory.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "starling/core/log.hpp"

namespace starling::moe {

namespace {

std::vector<Declaration> decode_all(const std::vector<Bytes>& values) {
  std::vector<Declaration> out;
  for (const auto& v : values) {
    auto d = decode_declaration(v);
    if (d) out.push_back(std::move(d).value());
  }
  return out;
}

// Results of lookups running in parallel; shared with the spawned coroutines, so a caller
// that stops waiting (deadline) leaves nothing dangling.
struct Fanout {
  explicit Fanout(asio::any_io_executor ex, std::size_t n) : done(ex), results(n), left(n) {}
  AsyncEvent done;
  std::vector<std::optional<result<std::vector<Bytes>>>> results;
  std::size_t left;
};

awaitable<void> fetch_one(std::shared_ptr<averaging::Directory> dir, std::shared_ptr<Fanout> f,
                          std::size_t i, Bytes key) {
  auto r = co_await dir->get(std::move(key));
  f->results[i] = std::move(r);
  if (--f->left == 0) f->done.set();
}

}  // namespace

Bytes directory_key(const std::string& prefix_or_uid) {
  const std::string k = "moe/" + prefix_or_uid;
  return Bytes(k.begin(), k.end());
}

awaitable<result<void>> ExpertDirectory::declare(std::vector<ExpertUid> uids, Declaration self,
                                                 Duration ttl) {
  const WallTime expires = WallClock::now() + std::chrono::duration_cast<WallClock::duration>(ttl);
  const std::string me = self.peer.to_string();
  std::map<std::pair<std::string, std::uint32_t>, bool> prefixes;  // (prefix, coord) -> leaf
  for (const auto& uid : uids)
    for (const auto& e : declaration_prefixes(uid)) prefixes[{e.prefix, e.coordinate}] = e.leaf;
  std::optional<Error> first;
  for (const auto& [pc, leaf] : prefixes) {
    Declaration d = self;
    d.coordinate = pc.second;
    d.leaf = leaf;
    const std::string sub = std::to_string(pc.second) + "@" + me;
    Bytes key = directory_key(pc.first);
    Bytes subkey(sub.begin(), sub.end());
    Bytes value = encode_declaration(d);
    auto r = co_await dir_->put(std::move(key), std::move(subkey), std::move(value), expires);
    if (!r && !first) first = r.error().with_context("declare prefix " + pc.first);
  }
  for (const auto& uid : uids) {
    Declaration d = self;
    d.coordinate = uid.coords.empty() ? 0 : uid.coords.back();
    d.leaf = true;
    Bytes key = directory_key(uid.to_string());
    Bytes subkey(me.begin(), me.end());
    Bytes value = encode_declaration(d);
    auto r = co_await dir_->put(std::move(key), std::move(subkey), std::move(value), expires);
    if (!r && !first) first = r.error().with_context("declare " + uid.to_string());
  }
  if (first) co_return *first;
  co_return success();
}

awaitable<result<std::vector<Declaration>>> ExpertDirectory::lookup_prefix(std::string prefix) {
  auto it = cache_.find(prefix);
  if (it != cache_.end() && Clock::now() - it->second.fetched < cache_ttl_)
    co_return it->second.decls;
  ++lookups_;
  ST_CO_TRY(auto values, co_await dir_->get(directory_key(prefix)));
  auto decls = decode_all(values);
  cache_[prefix] = CacheEntry{Clock::now(), decls};
  co_return decls;
}

awaitable<result<std::vector<Declaration>>> ExpertDirectory::find_expert(std::string uid) {
  ++lookups_;
  ST_CO_TRY(auto values, co_await dir_->get(directory_key(uid)));
  co_return decode_all(values);
}

awaitable<result<std::vector<std::vector<ExpertEndpoint>>>> ExpertDirectory::beam_search(
    std::string grid, std::vector<std::vector<std::vector<float>>> scores, std::size_t k,
    Duration timeout) {
  const TimePoint deadline = Clock::now() + timeout;
  BeamSearchCore core(grid, std::move(scores), k);
  // Servers of each leaf (uid), from the last level's declarations.
  std::map<std::string, std::vector<Declaration>> servers;
  auto ex = co_await asio::this_coro::executor;
  for (int round = 0; round < 64 && !core.advance(); ++round) {
    std::vector<std::string> need;
    for (auto& p : core.wanted()) {
      auto it = cache_.find(p);
      if (it != cache_.end() && Clock::now() - it->second.fetched < cache_ttl_) continue;
      need.push_back(p);
    }
    if (!need.empty()) {
      auto fan = std::make_shared<Fanout>(ex, need.size());
      for (std::size_t i = 0; i < need.size(); ++i) {
        ++lookups_;
        asio::co_spawn(ex, fetch_one(dir_, fan, i, directory_key(need[i])), asio::detached);
      }
      const auto left = deadline - Clock::now();
      auto waited = co_await with_timeout(fan->done.wait(), std::max(left, Duration::zero()),
                                          "expert beam search");
      if (!waited && waited.error() == errc::cancelled) co_return waited.error();
      for (std::size_t i = 0; i < need.size(); ++i) {
        auto& r = fan->results[i];
        if (r && r->has_value()) {
          cache_[need[i]] = CacheEntry{Clock::now(), decode_all(r->value())};
        } else if (r) {
          logger("moe")->debug("lookup of {} failed: {}", need[i], r->error().message());
        }
      }
      if (!waited) {
        // Out of time: whatever is still unknown is treated as a dead end.
        for (auto& p : core.wanted())
          if (!cache_.count(p)) core.provide(p, {});
      }
    }
    for (auto& p : core.wanted()) {
      auto it = cache_.find(p);
      std::vector<std::uint32_t> children;
      if (it != cache_.end()) {
        for (const auto& d : it->second.decls) {
          children.push_back(d.coordinate);
          if (d.leaf) servers[p + std::to_string(d.coordinate)].push_back(d);
        }
      }
      core.provide(p, std::move(children));
    }
  }
  // Leaves whose last prefix came from the cache in an earlier call: fill their servers.
  std::vector<std::vector<ExpertEndpoint>> out(core.results().size());
  for (std::size_t i = 0; i < core.results().size(); ++i) {
    for (const auto& c : core.results()[i]) {
      std::vector<std::uint32_t> parent(c.coords.begin(), c.coords.end() - 1);
      const std::string uid = core.prefix_of(parent) + std::to_string(c.coords.back());
      auto sit = servers.find(uid);
      if (sit == servers.end()) {
        auto cit = cache_.find(core.prefix_of(parent));
        std::vector<Declaration> found;
        if (cit != cache_.end())
          for (const auto& d : cit->second.decls)
            if (d.leaf && d.coordinate == c.coords.back()) found.push_back(d);
        sit = servers.emplace(uid, std::move(found)).first;
      }
      if (sit->second.empty()) continue;
      out[i].push_back(ExpertEndpoint{uid, sit->second, c.score});
    }
  }
  co_return out;
}

}  // namespace starling::moe
