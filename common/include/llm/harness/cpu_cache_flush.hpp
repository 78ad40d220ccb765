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

namespace llm {

// Bytes of the last-level cache as the OS reports it (sysconf, then
// /sys/devices/system/cpu/cpu0/cache/index3/size), or 0 when unknown.
std::size_t last_level_cache_bytes();

// The flush buffer's upper bound. A full run (--full) allows 1 GiB: a server
// CPU reports hundreds of MiB of last-level cache. A default run allows 256
// MiB, which still evicts a laptop's or desktop's last-level cache (8-64 MiB)
// several times over and keeps the run under 1 GB of memory.
constexpr std::size_t kFullRunFlushLimit = std::size_t{1} << 30;
constexpr std::size_t kDefaultRunFlushLimit = std::size_t{256} << 20;

class CpuCacheFlusher {
 public:
  // bytes = 0: twice the last-level cache (the replacement policy is not
  // strict LRU), at least 8 MiB and at most `max_bytes`.
  explicit CpuCacheFlusher(std::size_t bytes = 0, std::size_t max_bytes = kFullRunFlushLimit);
  void flush();  // writes every byte of the buffer (a new value each time)
  std::size_t bytes() const { return buffer_.size(); }

 private:
  std::vector<unsigned char> buffer_;  // [bytes]
  unsigned char round_ = 0;
};

// Milliseconds of one call of `fn`, after a flush (flusher == nullptr: no
// flush, warm caches). The flush itself is not timed.
double time_one_run(const std::function<void()>& fn, CpuCacheFlusher* flusher);

}  // namespace llm
