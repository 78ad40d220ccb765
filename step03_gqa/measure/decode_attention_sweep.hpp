#pragma once
// The decode-attention measurement: one query (one new token) against a KV
// cache of `context` positions, for the same query heads with fewer and fewer
// KV heads (MHA -> GQA -> MQA), for every variant, on the CPU and on CUDA.
// Each result is checked against common's reference attention. CPU cells of
// one context are timed round-robin (see the .cpp), CUDA cells with events.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "llm/harness/compare.hpp"
#include "llm/harness/cpu_cache_flush.hpp"
#include "llm/harness/progress.hpp"
#include "llm/harness/timer.hpp"

namespace step03 {

struct SweepOptions {
  int n_heads = 32;                            // query heads (Llama-2-7B / Llama-3-8B: 32)
  int head_dim = 128;                          // Llama-family head size
  std::vector<int> kv_heads = {32, 16, 8, 4, 1};  // MHA, groups of 2, 4, 8, MQA
  std::vector<int> contexts = {1024, 2048, 4096, 8192, 16384, 32768};
  std::vector<int> variant_ids = {0, 1};
  bool cpu = true;
  bool cuda = false;
  int warmup = 1;
  int repeats = 5;
  bool flush_caches = true;     // evict CPU caches before every timed CPU run (cpu_cache_flush.hpp)
  std::size_t flush_limit_bytes = llm::kFullRunFlushLimit;  // the flush buffer's upper bound
  double max_host_gib = 4.0;    // skip a context whose caches (all KV-head counts) + repeat_kv copy need more host memory
  std::uint64_t seed = 42;
  llm::RunProgress* progress = nullptr;  // when set: one part per context (contexts_that_fit)
};

struct SweepCell {
  std::string device;             // "cpu" | "cuda"
  int variant_id = 0;
  std::string variant_name;
  int n_heads = 0;
  int kv_heads = 0;
  int context = 0;                // positions in the cache; the query is the last one
  llm::TimingStats timing;
  llm::CompareResult error;       // against llm::cpu::reference_decode_attention
  std::size_t kv_bytes_per_token_formula = 0;   // 2 x kv_heads x head_dim x 4 bytes (this one layer, fp32)
  std::size_t kv_bytes_per_token_measured = 0;  // the CpuKvCache's bytes_allocated() / capacity
  std::size_t cache_bytes_at_context = 0;       // K and V of `context` positions: what attention must read
};

struct SweepResult {
  std::vector<SweepCell> cells;
  std::vector<std::string> skipped;  // "context 65536: ... need 5.9 GiB > --max-host-gib 4"
  std::size_t flush_bytes = 0;       // 0 when caches were not flushed
};

// The contexts of `options` whose caches (every KV-head count at once, and
// the repeat_kv copy) fit in max_host_gib; why each other one is skipped goes
// to `skipped` when given.
std::vector<int> contexts_that_fit(const SweepOptions& options, std::vector<std::string>* skipped = nullptr);

SweepResult run_decode_attention_sweep(const SweepOptions& options);

}  // namespace step03
