// Huge-page slabs for HugePageAllocator (llm/huge_page_allocator.hpp).
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#include "llm/huge_page_allocator.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace llm::huge_pages {
namespace {

std::size_t round_up(std::size_t bytes, std::size_t multiple) { return (bytes + multiple - 1) / multiple * multiple; }

// One 2 MiB-aligned region: allocations are carved from the front (`used`)
// and counted (`live`); it is freed when the count returns to zero.
struct Slab {
  char* base = nullptr;
  std::size_t capacity = 0;  // bytes, a multiple of kPageBytes
  std::size_t used = 0;      // bytes handed out so far (never reused while the slab lives)
  std::size_t live = 0;      // allocations not yet released
};

// Models are built and destroyed on several threads (step 07's server), so
// the slab list is shared under a mutex; allocation happens at load time only.
std::mutex slabs_mutex;
std::vector<Slab> slabs;

Slab new_slab(std::size_t capacity) {
  void* memory = nullptr;
  if (posix_memalign(&memory, kPageBytes, capacity) != 0) throw std::bad_alloc();
#if defined(MADV_HUGEPAGE)
  // Advice only: its failure (huge pages disabled) leaves ordinary pages.
  static_cast<void>(madvise(memory, capacity, MADV_HUGEPAGE));
#endif
  return {static_cast<char*>(memory), capacity, 0, 0};
}

}  // namespace

void* allocate(std::size_t bytes) {
  bytes = round_up(bytes, kAlignment);
  const std::lock_guard lock(slabs_mutex);
  // A matrix of half a slab or more gets a slab of its own, sized to it.
  if (bytes >= kSlabBytes / 2) {
    slabs.push_back(new_slab(round_up(bytes, kPageBytes)));
  } else if (slabs.empty() || slabs.back().capacity - slabs.back().used < bytes) {
    slabs.push_back(new_slab(kSlabBytes));
  }
  Slab& slab = slabs.back();
  void* memory = slab.base + slab.used;
  slab.used += bytes;
  ++slab.live;
  return memory;
}

void release(void* memory) noexcept {
  const std::lock_guard lock(slabs_mutex);
  const char* address = static_cast<const char*>(memory);
  for (auto slab = slabs.begin(); slab != slabs.end(); ++slab) {
    if (address < slab->base || address >= slab->base + slab->capacity) continue;
    if (--slab->live == 0) {
      std::free(slab->base);
      slabs.erase(slab);
    }
    return;
  }
}

std::size_t slabs_held() {
  const std::lock_guard lock(slabs_mutex);
  return slabs.size();
}

}  // namespace llm::huge_pages
