#include "starling/averaging/float_buffer.hpp"

#include <cstdlib>
#include <map>
#include <mutex>

namespace starling::averaging {

namespace {

struct Cache {
  std::mutex mu;
  std::multimap<std::size_t, void*> free;  // by exact size in bytes
  std::size_t bytes = 0;
};

// Never destroyed: buffers may be freed by threads that outlive static destruction.
Cache& cache() {
  static Cache* c = new Cache;
  return *c;
}

}  // namespace

void* buffer_allocate(std::size_t bytes) {
  if (bytes >= kRecycleMin) {
    Cache& c = cache();
    std::lock_guard lock(c.mu);
    // Parts of a round have one size (the last one of a range is smaller): exact matches.
    if (auto it = c.free.find(bytes); it != c.free.end()) {
      void* p = it->second;
      c.free.erase(it);
      c.bytes -= bytes;
      return p;
    }
  }
  return ::operator new(bytes);
}

void buffer_free(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes >= kRecycleMin) {
    Cache& c = cache();
    std::lock_guard lock(c.mu);
    if (c.bytes + bytes <= kRecycleCapacity) {
      try {
        c.free.emplace(bytes, p);
        c.bytes += bytes;
        return;
      } catch (...) {  // no memory for the node: free the block instead
      }
    }
  }
  ::operator delete(p);
}

std::size_t buffer_cache_bytes() noexcept {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  return c.bytes;
}

}  // namespace starling::averaging
