#include "step06_quantization/measure/cpu_bandwidth.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "llm/harness/timer.hpp"
#include "llm/harness/cpu_cache_flush.hpp"

namespace step06 {

double measure_cpu_read_bandwidth_gbps(int runs, std::size_t max_bytes) {
  // Twice the last-level cache as the OS reports it, at least 256 MiB and at
  // most `max_bytes` (a virtual machine may report the whole host's cache):
  // every pass streams from DRAM, and the buffer stays within a laptop's memory.
  const std::size_t min_bytes = std::min(std::size_t{256} << 20, max_bytes);
  const std::size_t bytes = std::clamp<std::size_t>(2 * llm::last_level_cache_bytes(), min_bytes, max_bytes);
  std::vector<std::uint64_t> buffer(bytes / sizeof(std::uint64_t));  // [words]
  for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = i * 0x9E3779B97F4A7C15ull;
  // Integer sums: associative, so the compiler vectorizes the loop with
  // several accumulators and the loop runs as fast as memory feeds it.
  volatile std::uint64_t sink = 0;
  const auto read_all = [&] {
    std::uint64_t sum = 0;
    for (const std::uint64_t word : buffer) sum += word;
    sink = sink + sum;
  };
  const llm::TimingStats time = llm::time_cpu(read_all, /*warmup=*/1, runs);
  return static_cast<double>(bytes) / (time.median_ms * 1e-3) / 1e9;
}

}  // namespace step06
