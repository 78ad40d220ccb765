#pragma once
// An allocator for big arrays that are read from front to back again and
// again, like the weights a decode step streams through once per token.
//
// Why: the CPU translates every address through its TLB, which holds a few
// thousand page translations. With 4 KiB pages that covers a few MiB, so a
// pass over 58 MiB of weights (the `small` preset) misses the TLB every 4 KiB
// and walks the page table each time. Linux can back memory with 2 MiB pages
// instead ("transparent huge pages"), one translation per 2 MiB; on most
// distributions it does so only for memory that asks, with
// madvise(MADV_HUGEPAGE), and only for whole 2 MiB-aligned ranges.
//
// So allocations of at least kSmallestBytes are carved one after another out
// of 2 MiB-aligned, advised slabs: a model's many mid-sized matrices (a
// stories15M-sized layer has 0.3-0.9 MiB matrices) share huge pages instead
// of each rounding up to its own 2 MiB. A slab is returned to the system when
// the last allocation in it is released. Smaller allocations are ordinary.
// The advice is a hint: where the kernel has huge pages off, or on another
// OS, the memory is ordinary and everything works the same.
//
// Measured effect: docs/01_kv_cache.md, section 5.2.
#include <cstddef>
#include <new>
#include <vector>

namespace llm {
namespace huge_pages {

inline constexpr std::size_t kPageBytes = std::size_t{2} << 20;       // x86-64, and arm64 with 4 KiB pages
inline constexpr std::size_t kSmallestBytes = std::size_t{64} << 10;  // below this, ordinary operator new
inline constexpr std::size_t kSlabBytes = std::size_t{32} << 20;      // one shared slab: 16 huge pages
inline constexpr std::size_t kAlignment = 64;                         // a cache line (and an AVX-512 vector)

// `bytes` (at least kSmallestBytes), kAlignment-aligned, from a huge-page slab.
void* allocate(std::size_t bytes);
// Returns what allocate() gave (its slab is found from the address); frees
// the slab when it was the slab's last live allocation.
void release(void* memory) noexcept;
// Slabs currently held from the system (for tests: 0 once every allocation is released).
std::size_t slabs_held();

}  // namespace huge_pages

template <class T>
struct HugePageAllocator {
  using value_type = T;

  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    if (bytes < huge_pages::kSmallestBytes) return static_cast<T*>(::operator new(bytes));
    return static_cast<T*>(huge_pages::allocate(bytes));
  }

  void deallocate(T* memory, std::size_t n) noexcept {
    if (n * sizeof(T) < huge_pages::kSmallestBytes)
      ::operator delete(memory);
    else
      huge_pages::release(memory);
  }

  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

// A std::vector whose big buffers sit on huge pages where the OS allows.
template <class T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace llm
