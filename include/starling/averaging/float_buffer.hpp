// FloatBuffer: the vector type of the all-reduce data path (received parts, owners' slots,
// decoded payloads). Two differences from std::vector<float>: resize() leaves new elements
// uninitialised (every use overwrites them at once: zero-filling 4 bytes per value cost as
// much as receiving them), and blocks of at least kRecycleMin bytes are recycled through a
// process-wide cache instead of going back to the OS, so that a round does not page-fault
// its buffers in again (a 64 MiB round touched ~16k fresh pages per member before).
//
// Threading rule: any thread (the cache has a mutex); a buffer itself is not shared.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <vector>

namespace starling::averaging {

inline constexpr std::size_t kRecycleMin = 64 * 1024;
// Bytes of free blocks the cache keeps at most (beyond it, blocks are freed).
inline constexpr std::size_t kRecycleCapacity = 256u << 20;

void* buffer_allocate(std::size_t bytes);
void buffer_free(void* p, std::size_t bytes) noexcept;
// Bytes currently held by the cache (tests).
std::size_t buffer_cache_bytes() noexcept;

template <class T>
struct RecyclingAllocator {
  using value_type = T;
  RecyclingAllocator() = default;
  template <class U>
  RecyclingAllocator(const RecyclingAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(buffer_allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { buffer_free(p, n * sizeof(T)); }
  // Default-initialisation: resize() does not zero the values.
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
  friend bool operator==(const RecyclingAllocator&, const RecyclingAllocator&) { return true; }
};

using FloatBuffer = std::vector<float, RecyclingAllocator<float>>;

}  // namespace starling::averaging
