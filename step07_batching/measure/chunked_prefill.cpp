#include "step07_batching/measure/chunked_prefill.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "llm/errors.hpp"

namespace step07 {

std::vector<Request> with_long_prompts(std::vector<Request> requests, const ChunkedPrefillOptions& options,
                                       const PromptSource& prompts, int context) {
  const int long_length =
      std::clamp(static_cast<int>(std::lround(options.long_prompt_fraction * context)), 2, context - 1);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (static_cast<int>(i % static_cast<std::size_t>(options.long_prompt_every)) != options.long_prompt_every - 1)
      continue;
    Request& request = requests[i];
    request.prompt = prompts.prompt(long_length, options.seed + static_cast<std::uint64_t>(request.id));
    // It holds prompt + max_tokens - 1 positions at most.
    request.max_tokens = std::min(request.max_tokens, context - long_length + 1);
  }
  return requests;
}

std::vector<ChunkedPrefillRow> compare_chunk_sizes(const std::string& device, llm::Model& model,
                                                   const std::vector<Request>& scenario,
                                                   const std::vector<std::vector<int>>& solo,
                                                   const ServingLimits& limits, const ChunkedPrefillOptions& options) {
  std::vector<int> settings = {0};  // 0: off
  for (const int chunk : options.chunk_tokens) {
    if (chunk < limits.max_sequences)
      throw llm::InputError(fmt::format("chunk size {} is below the largest batch ({}): a forward must hold a "
                                        "decode row for every sequence",
                                        chunk, limits.max_sequences));
    settings.push_back(chunk);
  }
  std::vector<ChunkedPrefillRow> rows;
  for (const int chunk : settings) {
    ServingLimits chunk_limits = limits;
    const bool chunked = chunk > 0;
    if (chunked) chunk_limits.chunk_tokens = chunk;
    const ServingPolicy& serving = policy(chunked ? kContinuousChunked : kContinuous);
    const ReplayResult run =
        replay(model, scenario, engine_options_for(serving, chunk_limits, model.config().seq_len), &solo);
    rows.push_back({device, chunk, run.metrics,
                    check_replay(model, scenario, run, solo, llm::same_rounding_logits_tolerance(limits.weight_type))});
  }
  return rows;
}

}  // namespace step07
