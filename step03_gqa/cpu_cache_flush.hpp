#pragma once
// Evicting the CPU's caches between timed runs (the CPU twin of the L2 flush
// in llm::cuda::time_cuda).
//
// Why: inside a real model, between two decode steps' visits to layer l's KV
// cache, every other layer's weights and KV stream through the caches, so
// layer l's K/V come from DRAM. Timed back to back, a small cache (a few MiB
// of MQA K/V) would stay in a large last-level cache (hundreds of MiB on a
// server CPU) and look faster than it is; a flush puts every configuration
// back on DRAM bandwidth, which is what decode attention is bound by.
#include <cstddef>
#include <functional>
#include <vector>

#include "llm/harness/timer.hpp"

namespace step03 {

// Bytes of the last-level cache as the OS reports it (sysconf, then
// /sys/devices/system/cpu/cpu0/cache/index3/size), or 0 when unknown.
std::size_t last_level_cache_bytes();

class CpuCacheFlusher {
 public:
  // bytes = 0: twice the last-level cache (the replacement policy is not
  // strict LRU), at least 8 MiB and at most 1 GiB.
  explicit CpuCacheFlusher(std::size_t bytes = 0);
  void flush();  // writes every byte of the buffer (a new value each time)
  std::size_t bytes() const { return buffer_.size(); }

 private:
  std::vector<unsigned char> buffer_;  // [bytes]
  unsigned char round_ = 0;
};

// Milliseconds of one call of `fn`, after a flush (flusher == nullptr: no
// flush, warm caches). The flush itself is not timed.
double time_one_run(const std::function<void()>& fn, CpuCacheFlusher* flusher);

}  // namespace step03
