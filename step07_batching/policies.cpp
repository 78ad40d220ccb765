#include "step07_batching/policies.hpp"

#include <fmt/format.h>

#include "llm/errors.hpp"

namespace step07 {

const std::vector<llm::Variant<ServingPolicy>>& policies() {
  static const std::vector<llm::Variant<ServingPolicy>> table = {
      {kOneAtATime, "one_at_a_time", "one request from prompt to last token, then the next", llm::Backend::Any,
       {Admission::WhenBatchEmpty, true, false}},
      {kStatic, "static", "batches in arrival order; a batch runs until its longest request ends",
       llm::Backend::Any, {Admission::WhenBatchEmpty, false, false}},
      {kContinuous, "continuous", "the batch re-forms every iteration: finished requests leave, waiting ones join",
       llm::Backend::Any, {Admission::EveryIteration, false, false}},
      {kContinuousChunked, "continuous_chunked",
       "continuous, with long prompts prefilled in chunks beside the decode rows", llm::Backend::Any,
       {Admission::EveryIteration, false, true}},
  };
  return table;
}

const ServingPolicy& policy(int id) {
  for (const auto& row : policies())
    if (row.id == id) return row.fn;
  throw llm::InputError(fmt::format("no serving policy with id {}", id));
}

EngineOptions engine_options_for(const ServingPolicy& policy, const ServingLimits& limits, int context) {
  EngineOptions options;
  options.block_size = limits.block_size;
  options.n_blocks = limits.kv_blocks;
  options.scheduler.admission = policy.admission;
  options.scheduler.max_sequences = policy.one_sequence ? 1 : limits.max_sequences;
  options.scheduler.chunked_prefill = policy.chunked_prefill;
  options.scheduler.token_budget =
      policy.chunked_prefill ? limits.chunk_tokens : context + options.scheduler.max_sequences;
  return options;
}

}  // namespace step07
