// Step 07's engine on the GPU: the course's CUDA model (what step 07 runs on
// CUDA: common/cuda, its kernels reading the engine's block tables) serves
// every policy under a KV pool of one full context (preemption, chunked
// prefill), and each request's greedy tokens equal its solo tokens on the
// same model with its own contiguous cache, or part from them only at a
// near-tie that check_replay explains; fp32 weights and fp16 ones, on the
// tiny preset and on stories260K. In fp16 (the model's default,
// --max-gemv-rows 1) a decode row that runs alone goes through the GEMV and
// the same row in a batch through cuBLAS: both paths round x alike
// (half_linear.cu), and what is left is the order of fp32 sums. Skips where no GPU can be present and fails where
// one is present but unusable (LLM_REQUIRE_CUDA_DEVICE,
// tests/test_support.hpp); stories260K's cases skip without its files.
#include <gtest/gtest.h>

#include <string>

#include "llm/checkpoint.hpp"
#include "llm/config.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/tokenizer.hpp"
#include "llm/weights.hpp"
#include "step07_batching/measure/replay.hpp"
#include "step07_serving_checks.hpp"
#include "test_support.hpp"

namespace step07 {
namespace {

using testing::expect_every_policy_exact;
using testing::small_workload;
using testing::tight_limits;

// The engine and the solo reference on two instances of the CUDA model with
// the same weight type (graphs and fusions on, as step 07 runs it).
void expect_cuda_policies_match_solo(const llm::ModelWeights& weights, const std::vector<Request>& requests) {
  for (const auto dtype : {llm::cuda::WeightDtype::Float32, llm::cuda::WeightDtype::Float16}) {
    SCOPED_TRACE(llm::cuda::to_string(dtype));
    llm::cuda::CudaRunOptions run;
    run.dtype = dtype;
    auto engine_model = llm::make_model_on("cuda", weights, run);
    auto solo_model = llm::make_model_on("cuda", weights, run);
    ServingLimits limits = tight_limits(weights.config);
    limits.weight_type = llm::compare_dtype(dtype);
    expect_every_policy_exact(*engine_model, requests, solo_outputs(*solo_model, requests), limits, true);
  }
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
