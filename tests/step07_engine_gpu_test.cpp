// Step 07's engine on the GPU: the CUDA paged model serves every policy under
// a KV pool of one full context (preemption, chunked prefill), and each
// request's greedy tokens equal its solo tokens on the CUDA model with its
// own contiguous cache; on the tiny preset and on stories260K. Skips where no
// GPU can be present and fails where one is present but unusable
// (LLM_REQUIRE_CUDA_DEVICE, tests/test_support.hpp); stories260K's cases skip
// without its files.
#include <gtest/gtest.h>

#include "llm/checkpoint.hpp"
#include "llm/config.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/tokenizer.hpp"
#include "llm/weights.hpp"
#include "step05_paged_attention/measure/paged_generation.hpp"
#include "step07_batching/measure/replay.hpp"
#include "step07_serving_checks.hpp"
#include "test_support.hpp"

namespace step07 {
namespace {

using testing::expect_every_policy_exact;
using testing::small_workload;
using testing::tight_limits;

// The engine on the paged CUDA model; the reference from the plain CUDA model.
void expect_cuda_policies_match_solo(const llm::ModelWeights& weights, const std::vector<Request>& requests) {
  auto paged = step05::make_paged_model_on("cuda", weights);
  auto plain = llm::make_model_on("cuda", weights);
  expect_every_policy_exact(*paged, requests, solo_outputs(*plain, requests), tight_limits(weights.config), true);
}

TEST(Step07EngineGpu, EveryPolicyMatchesSoloOnTinyPreset) {
  LLM_REQUIRE_CUDA_DEVICE();
  const llm::ModelWeights weights = llm::random_weights(llm::find_preset("tiny").config, 7);
  expect_cuda_policies_match_solo(weights, small_workload(weights.config, 40, 3));
}

TEST(Step07EngineGpu, EveryPolicyMatchesSoloOnStories260K) {
  LLM_REQUIRE_CUDA_DEVICE();
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  LLM_REQUIRE_MODEL_FILE(tokenizer_path, "tok512.bin");
  const llm::ModelWeights weights = llm::load_checkpoint(model_path);
  const llm::Tokenizer tokenizer = llm::Tokenizer::load(tokenizer_path, weights.config.vocab_size);
  expect_cuda_policies_match_solo(weights, small_workload(weights.config, 30, 17, &tokenizer));
}

}  // namespace
}  // namespace step07
