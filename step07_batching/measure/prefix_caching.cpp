#include "step07_batching/measure/prefix_caching.hpp"

#include <algorithm>
#include <cmath>

namespace step07 {

int system_prompt_tokens(const PrefixCachingOptions& options, int context) {
  return std::clamp(static_cast<int>(std::lround(options.system_prompt_fraction * context)), 1, context - 1);
}

std::vector<Request> with_system_prompt(std::vector<Request> requests, const PrefixCachingOptions& options,
                                        const PromptSource& prompts, int context) {
  const std::vector<int> system = prompts.prompt(system_prompt_tokens(options, context), options.seed);
  for (Request& request : requests) {
    std::vector<int> prompt = system;
    // Its own prompt after its BOS, at most up to context - 1 positions.
    const auto own_tokens = std::min<std::ptrdiff_t>(std::ssize(request.prompt) - 1,
                                                     context - 1 - std::ssize(system));
    prompt.insert(prompt.end(), request.prompt.begin() + 1, request.prompt.begin() + 1 + std::max<std::ptrdiff_t>(0, own_tokens));
    request.prompt = std::move(prompt);
    // It holds prompt + max_tokens - 1 positions at most.
    request.max_tokens = std::min(request.max_tokens, context - static_cast<int>(request.prompt.size()) + 1);
  }
  return requests;
}

std::vector<PrefixCachingRow> compare_prefix_caching(const std::string& device, llm::Model& model,
                                                     const std::vector<Request>& scenario,
                                                     const std::vector<std::vector<int>>& solo,
                                                     const ServingLimits& limits, const PrefixCachingOptions& options) {
  std::vector<PrefixCachingRow> rows;
  const int context = model.config().seq_len;
  for (const bool prefix_caching : {false, true}) {
    EngineOptions engine = engine_options_for(policy(kContinuous), limits, context);
    engine.prefix_caching = prefix_caching;
    const ReplayResult run = replay(model, scenario, engine, &solo);
    PrefixCachingRow row;
    row.device = device;
    row.prefix_caching = prefix_caching;
    row.system_prompt_tokens = system_prompt_tokens(options, context);
    row.metrics = run.metrics;
    row.check = check_replay(model, scenario, run, solo, llm::same_rounding_logits_tolerance(limits.weight_type));
    for (const IterationRecord& iteration : run.iterations) {
      row.rows_computed += iteration.decode_rows + iteration.prefill_rows;
      row.prefill_rows += iteration.prefill_rows;
    }
    row.blocks = run.blocks;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace step07
