#pragma once
// The step's four parts as results rows (the JSON) and as their own printed
// tables. report_bookkeeping_and_kernels.cpp: parts 1 and 2;
// report_model_parts.cpp: parts 3 and 4.
#include <vector>

#include "llm/harness/results.hpp"
#include "step05_paged_attention/measure/kernel_overhead.hpp"
#include "step05_paged_attention/measure/memory_replay.hpp"
#include "step05_paged_attention/measure/paged_generation.hpp"
#include "step05_paged_attention/measure/prefix_sharing.hpp"

namespace step05 {

// 1. Memory: one model's replay rows (contiguous, then paged per block
// size, each with its replay's wall time) and its trace's lengths.
struct ModelMemoryReplay {
  std::vector<MemoryReplayRow> rows;
  LengthSummary lengths;
};
// One row per (model, policy) on "cpu" (bookkeeping runs on the host);
// speedup = mean sequences / contiguous reservation's; ok = every request
// finished with sane fractions. The targets go in a JSON table per model.
void add_memory_rows(llm::Results& results, const std::vector<ModelMemoryReplay>& replays);
void print_memory(const std::vector<ModelMemoryReplay>& replays, int budget_sequences);

// 2. Kernel overhead: one row per cell; speedup = contiguous time / this
// (below 1: the cost of paging); copy_gbps (0: no GPU) puts CUDA rows'
// GB/s against the GPU's measured copy bandwidth.
void add_overhead_rows(llm::Results& results, const KernelOverheadResult& overhead, double copy_gbps);
void print_overhead(const KernelOverheadResult& overhead);

// 3. Prefix sharing: one row per device and setting; time = TTFT (a miss
// without sharing, a hit with it), speedup = miss / that, ok = identical tokens.
void add_prefix_sharing_rows(llm::Results& results, const PrefixSharingResult& sharing, int block_size);
void print_prefix_sharing(const std::vector<PrefixSharingResult>& sharing, int block_size);

// 4. The model: one row per check; time = the run's forwards, speedup =
// tokens per second vs the contiguous cache on the same device, ok = tokens
// identical to it.
void add_generation_rows(llm::Results& results, const std::vector<GenerationCheck>& checks);
void print_generation(const std::vector<GenerationCheck>& checks);

}  // namespace step05
