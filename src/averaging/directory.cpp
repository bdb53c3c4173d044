#include "starling/averaging/directory.hpp"

#include <fstream>
#include <random>

#include "starling/averaging/wire.hpp"

namespace starling::averaging {

awaitable<result<void>> MemoryDirectory::put(Bytes key, Bytes subkey, Bytes value,
                                             WallTime expires) {
  std::lock_guard lock(mu_);
  data_[std::move(key)][std::move(subkey)] = {std::move(value), expires};
  co_return success();
}

awaitable<result<std::vector<Bytes>>> MemoryDirectory::get(Bytes key) {
  std::vector<Bytes> out;
  {
    std::lock_guard lock(mu_);
    const auto now = WallClock::now();
    auto it = data_.find(key);
    if (it != data_.end())
      for (const auto& [sub, item] : it->second)
        if (item.expires > now) out.push_back(item.value);
  }
  co_return out;
}

// File layout: root/<hex key>/<hex subkey>, content = 8-byte little-endian expiry (unix ms)
// followed by the value.
awaitable<result<void>> FileDirectory::put(Bytes key, Bytes subkey, Bytes value, WallTime expires) {
  std::error_code ec;
  const auto dir = root_ / to_hex(key);
  std::filesystem::create_directories(dir, ec);
  if (ec) co_return make_error(errc::io, "directory: create " + dir.string() + ": " + ec.message());
  const auto final_path = dir / to_hex(subkey);
  const auto tmp = dir / (to_hex(subkey) + ".tmp" + std::to_string(std::random_device{}()));
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    const std::int64_t ms = wire::to_unix_ms(expires);
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>(static_cast<std::uint64_t>(ms) >> (8 * i)));
    f.write(reinterpret_cast<const char*>(value.data()),
            static_cast<std::streamsize>(value.size()));
    if (!f) co_return make_error(errc::io, "directory: write " + tmp.string());
  }
  std::filesystem::rename(tmp, final_path, ec);
  if (ec) co_return make_error(errc::io, "directory: rename " + tmp.string() + ": " + ec.message());
  co_return success();
}

awaitable<result<std::vector<Bytes>>> FileDirectory::get(Bytes key) {
  std::vector<Bytes> out;
  std::error_code ec;
  const auto dir = root_ / to_hex(key);
  if (!std::filesystem::exists(dir, ec)) co_return out;
  const auto now = wire::to_unix_ms(WallClock::now());
  for (const auto& ent : std::filesystem::directory_iterator(dir, ec)) {
    if (ent.path().extension().string().rfind(".tmp", 0) == 0) continue;
    std::ifstream f(ent.path(), std::ios::binary);
    Bytes all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (all.size() < 8) continue;
    std::uint64_t ms = 0;
    for (int i = 0; i < 8; ++i) ms |= std::uint64_t{all[i]} << (8 * i);
    if (static_cast<std::int64_t>(ms) <= now) continue;
    out.emplace_back(all.begin() + 8, all.end());
  }
  co_return out;
}

}  // namespace starling::averaging
