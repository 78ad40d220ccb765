#include "llm/harness/cpu_cache_flush.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>

namespace llm {

std::size_t last_level_cache_bytes() {
#ifdef _SC_LEVEL3_CACHE_SIZE
  const long bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (bytes > 0) return static_cast<std::size_t>(bytes);
#endif
  // sysfs writes sizes like "491520K".
  std::ifstream file("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string text;
  if (!(file >> text) || text.empty()) return 0;
  std::size_t value = 0;
  try {
    value = std::stoull(text);
  } catch (const std::exception&) {
    return 0;
  }
  const char unit = text.back();
  if (unit == 'K') value <<= 10;
  else if (unit == 'M') value <<= 20;
  return value;
}

CpuCacheFlusher::CpuCacheFlusher(std::size_t bytes, std::size_t max_bytes) {
  if (bytes == 0) bytes = 2 * last_level_cache_bytes();
  const std::size_t min_bytes = std::size_t{8} << 20;
  bytes = std::clamp<std::size_t>(bytes, min_bytes, std::max(min_bytes, max_bytes));
  buffer_.assign(bytes, 0);
}

void CpuCacheFlusher::flush() {
  // A different value every time, so no layer of the memory system can treat
  // the writes as redundant.
  ++round_;
  std::memset(buffer_.data(), round_, buffer_.size());
}

double time_one_run(const std::function<void()>& fn, CpuCacheFlusher* flusher) {
  if (flusher != nullptr) flusher->flush();
  Stopwatch watch;
  fn();
  return watch.elapsed_ms();
}

}  // namespace llm
