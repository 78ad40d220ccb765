// Step 07's engine: greedy outputs under every serving policy, under
// preemption and chunked prefill, equal each request's solo output, on the
// tiny preset and on stories260K; and the engine's errors.
#include <gtest/gtest.h>

#include "llm/config.hpp"
#include "llm/errors.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/checkpoint.hpp"
#include "llm/weights.hpp"
#include "step05_paged_attention/paged_generation.hpp"
#include "step07_batching/policies.hpp"
#include "step07_batching/replay.hpp"
#include "step07_batching/workload.hpp"
#include "test_support.hpp"

namespace {

using step07::Request;

std::vector<Request> small_workload(const llm::ModelConfig& config, int n_requests, double rate_per_s,
                                    std::uint64_t seed) {
  step07::WorkloadOptions options;
  options.lengths.n_requests = n_requests;
  options.lengths.context = config.seq_len;
  options.lengths.seed = seed;
  options.arrival_rate_per_s = rate_per_s;
  const step07::PromptSource prompts(nullptr, config.vocab_size, seed);
  return step07::make_workload(options, prompts);
}

// Every policy's tokens equal the solo tokens; `limits` sets the squeeze.
void expect_every_policy_exact(llm::Model& model, const std::vector<Request>& requests,
                               const step07::ServingLimits& limits, bool expect_preemption) {
  const auto solo = step07::solo_outputs(model, requests);
  long long preemptions = 0;
  for (const auto& policy : step07::policies()) {
    const auto options = step07::engine_options_for(policy.fn, limits, model.config().seq_len);
    const step07::ReplayResult run = step07::replay(model, requests, options);
    const step07::OutputCheck check = step07::check_outputs(run.records, solo);
    EXPECT_TRUE(check.ok()) << policy.name << ": " << check.first_difference;
    preemptions += run.metrics.preemptions;
  }
  if (expect_preemption) EXPECT_GT(preemptions, 0) << "the KV budget never ran out: preemption went untested";
}

TEST(Step07Engine, EveryPolicyMatchesSoloOnTinyPreset) {
  const llm::ModelWeights weights = llm::random_weights(llm::find_preset("tiny").config, 7);
  auto model = step05::make_paged_model_on("cpu", weights);
  const auto requests = small_workload(weights.config, 40, 0.0, 3);
  step07::ServingLimits limits;
  limits.max_sequences = 8;
  limits.chunk_tokens = 24;
  // One full context for eight slots: long requests must preempt.
  limits.kv_blocks = weights.config.seq_len / limits.block_size;
  expect_every_policy_exact(*model, requests, limits, true);
}

}  // namespace
