#pragma once
// Step 07's engine checks on either device: a small seeded trace (random-id
// prompts, or windows of the tokenizer's text), limits that squeeze the KV
// pool, and every serving policy's greedy tokens compared with each
// request's solo tokens.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "llm/config.hpp"
#include "llm/model.hpp"
#include "llm/tokenizer.hpp"
#include "step07_batching/policies.hpp"
#include "step07_batching/measure/replay.hpp"
#include "step07_batching/request.hpp"
#include "step07_batching/measure/workload.hpp"

namespace step07::testing {

// `n_requests` requests over the model's context, all arriving at t = 0,
// reproducible from `seed`; prompts from `tokenizer`'s text when given, else
// random ids.
inline std::vector<Request> small_workload(const llm::ModelConfig& config, int n_requests, std::uint64_t seed,
                                           const llm::Tokenizer* tokenizer = nullptr) {
  WorkloadOptions options;
  options.lengths.n_requests = n_requests;
  options.lengths.context = config.seq_len;
  options.lengths.seed = seed;
  const PromptSource prompts(tokenizer, config.vocab_size, seed);
  return make_workload(options, prompts);
}

// Eight slots sharing a KV pool of one full context (long requests must
// preempt), and chunks of 24 rows.
inline ServingLimits tight_limits(const llm::ModelConfig& config, int block_size = 16) {
  ServingLimits limits;
  limits.max_sequences = 8;
  limits.chunk_tokens = 24;
  limits.block_size = block_size;
  limits.kv_blocks = (config.seq_len + block_size - 1) / block_size;
  return limits;
}

// Every policy's tokens equal `solo` (solo_outputs of the same requests):
// exactly on the CPU; on a GPU up to partings at near-ties that check_replay
// explains within the tolerance of limits.weight_type. With
// `expect_preemption`, the policies together preempted at least once (the
// squeeze really squeezed).
inline void expect_every_policy_exact(llm::Model& model, const std::vector<Request>& requests,
                                      const std::vector<std::vector<int>>& solo, const ServingLimits& limits,
                                      bool expect_preemption) {
  long long preemptions = 0;
  for (const auto& policy : policies()) {
    const EngineOptions options = engine_options_for(policy.fn, limits, model.config().seq_len);
    const ReplayResult run = replay(model, requests, options, &solo);
    const OutputCheck check =
        check_replay(model, requests, run, solo, llm::same_rounding_logits_tolerance(limits.weight_type));
    EXPECT_TRUE(check.ok()) << policy.name << ", block size " << limits.block_size << ": " << check.first_difference;
    preemptions += run.metrics.preemptions;
  }
  if (expect_preemption) EXPECT_GT(preemptions, 0) << "the KV budget never ran out: preemption went untested";
}

}  // namespace step07::testing
