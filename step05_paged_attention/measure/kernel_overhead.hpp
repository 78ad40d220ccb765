#pragma once
// Part 2 of step 05: what paging costs the attention kernel. Decode attention
// over the SAME K/V rows in two layouts:
//   contiguous  one block per sequence (block_size 0 in the table): no table
//               lookups, rows read in address order
//   paged       blocks of 8, 16, 32 positions, the blocks of all sequences
//               shuffled over one pool (shuffled_kv_pool.hpp): one table
//               lookup per block, a jump to an unrelated address every block
// with the same kernel (the CPU kernel of paged_attention.hpp, the CUDA
// kernels of cuda_paged_attention.hpp, whose contiguous twin differs only in
// the table lookups), on the CPU and on the GPU. Every sequence of a batch is
// at the full context. Each cell is checked against common's reference
// attention. Expect a few percent at most: attention is bound by the bytes
// it reads, paging changes where they are, not how many.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "llm/harness/compare.hpp"
#include "llm/harness/timer.hpp"
#include "llm/harness/cpu_cache_flush.hpp"

namespace step05 {

struct KernelOverheadOptions {
  // The attention of one Llama-3-8B layer: 32 query heads sharing 8 KV heads
  // (GQA groups of 4), head_dim 128.
  int n_heads = 32;
  int n_kv_heads = 8;
  int head_dim = 128;
  std::vector<int> contexts = {1024, 2048, 4096, 8192, 16384, 32768};  // positions of every sequence
  std::vector<int> block_sizes = {8, 16, 32};                           // the paged layouts
  std::vector<int> batches = {1, 16};                                   // sequences per call
  bool cpu = true;
  bool cuda = false;
  int warmup = 1;
  int repeats = 5;
  // Evict the CPU caches before every timed CPU run (llm::CpuCacheFlusher,
  // common/harness), so K/V come from DRAM as inside a real model. (The
  // CUDA timer always flushes the L2.)
  bool flush_caches = true;
  std::size_t flush_limit_bytes = llm::kFullRunFlushLimit;  // the flush buffer's upper bound
  // Skip the CPU cells of a (context, batch) whose K/V (one layout) exceed
  // this many GiB of host memory; those cells hold the contiguous copy and
  // one pool per block size at once, (1 + block sizes) times that. CUDA
  // cells are not limited: their K/V are generated one sequence at a time on
  // the host and live on the GPU.
  double max_host_gib = 1.0;
  std::uint64_t seed = 42;
};

struct KernelOverheadCell {
  std::string device;   // "cpu" | "cuda"
  int context = 0;      // positions of every sequence (each query sees all of them)
  int batch = 0;        // sequences (queries) in the call
  int block_size = 0;   // 0: the contiguous layout (the baseline)
  llm::TimingStats timing;
  std::size_t kv_bytes_read = 0;  // K and V of every position of every sequence: batch x context x 2 x kv_dim x 4
  double gb_per_s = 0.0;          // kv_bytes_read / median time, in 1e9 bytes per second
  double overhead_percent = 0.0;  // median vs the contiguous cell of the same device, context and batch (0 for it)
  llm::CompareResult error;       // against llm::cpu::reference_decode_attention (fp32 tolerance; NaN fails)
};

struct KernelOverheadResult {
  // CPU cells, then CUDA cells; each device's in (context, batch) order, the
  // contiguous cell first, then the block sizes as given.
  std::vector<KernelOverheadCell> cells;
  std::vector<std::string> skipped;  // "cpu, context 32768, batch 16: ..."
  std::size_t flush_bytes = 0;       // bytes of the CPU cache flush (0: no flush)
};

// Throws llm::InputError for bad options (non-positive sizes, n_heads not a
// multiple of n_kv_heads, repeats < 1), llm::DeviceError when `cuda` is set
// and no GPU is usable.
KernelOverheadResult run_kernel_overhead(const KernelOverheadOptions& options);

}  // namespace step05
