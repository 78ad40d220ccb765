#pragma once
// Part 6 of the step: automatic prefix caching in the serving engine. Every
// request starts with the same long system prompt; with prefix caching, the
// first request to compute it publishes its full blocks (step 05's hash
// chain) and every later one shares them, computing only its own tail. The
// same scenario is served by continuous batching with the cache off, then
// on: first-token latency, prompt rows computed, the blocks hit out of those
// asked for, throughput; the tokens must be identical (to the solo runs,
// hence to each other).
#include <cstdint>
#include <string>
#include <vector>

#include "llm/model.hpp"
#include "step05_paged_attention/block_manager.hpp"
#include "step07_batching/measure/replay.hpp"
#include "step07_batching/measure/workload.hpp"
#include "step07_batching/policies.hpp"

namespace step07 {

struct PrefixCachingOptions {
  double system_prompt_fraction = 0.5;  // the shared system prompt's length, as a fraction of the context
  // Arrivals at this fraction of continuous batching's offline requests/s
  // (without the system prompt): requests arrive while earlier ones run, so
  // most find the system prompt already published.
  double load_factor = 0.5;
  std::uint64_t seed = 43;
};

struct PrefixCachingRow {
  std::string device;
  bool prefix_caching = false;
  int system_prompt_tokens = 0;
  ServingMetrics metrics;
  OutputCheck check;
  long long rows_computed = 0;  // every row of every forward
  long long prefill_rows = 0;   // of those, the engine's prefill rows (IterationRecord::prefill_rows)
  step05::BlockManagerCounters blocks;
  // Blocks shared from the cache / full blocks the admissions asked for.
  double hit_rate() const {
    return blocks.prefix_queried_blocks > 0
               ? static_cast<double>(blocks.prefix_hit_blocks) / static_cast<double>(blocks.prefix_queried_blocks)
               : 0.0;
  }
};

// The scenario's requests: each one's prompt is the system prompt (BOS
// first) followed by its own prompt without its BOS, cut to leave room for
// a token in the context (max_tokens cut to fit); the caller gives them
// arrival times (with_arrivals). system_prompt_tokens(): its length.
int system_prompt_tokens(const PrefixCachingOptions& options, int context);
std::vector<Request> with_system_prompt(std::vector<Request> requests, const PrefixCachingOptions& options,
                                        const PromptSource& prompts, int context);

// Continuous batching on `scenario` with the prefix cache off, then on;
// `solo`: the scenario's solo outputs.
std::vector<PrefixCachingRow> compare_prefix_caching(const std::string& device, llm::Model& model,
                                                     const std::vector<Request>& scenario,
                                                     const std::vector<std::vector<int>>& solo,
                                                     const ServingLimits& limits, const PrefixCachingOptions& options);

}  // namespace step07
