// Step 05's paged KV cache in GPU memory, read by the unchanged CUDA model
// with the reference kernels and with step 05's paged kernels: greedy tokens
// identical to step 01's contiguous CUDA cache for every block size, with a
// shared prefix and through a fork (copy-on-write on the device); running
// out of blocks is the same clear error as on the CPU.
#include <gtest/gtest.h>

#include "llm/checkpoint.hpp"
#include "llm/config.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/weights.hpp"
#include "step05_paged_attention/measure/paged_generation.hpp"
#include "step05_paged_attention/paged_kv_cache.hpp"
#include "step05_generation_checks.hpp"
#include "test_support.hpp"

namespace {

TEST(CudaPagedGeneration, TinyPresetGreedyTokensMatchTheContiguousCache) {
  LLM_REQUIRE_CUDA_DEVICE();
  const llm::ModelWeights weights = llm::random_weights(llm::find_preset("tiny").config, 42);
  const std::vector<int> prompt = {1, 300, 20, 7};
  step05::testing::expect_paged_generation_identical("cuda", weights, prompt, 70);
}

TEST(CudaPagedGeneration, Stories260KGreedyTokensMatchTheContiguousCache) {
  LLM_REQUIRE_CUDA_DEVICE();
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  const std::vector<int> prompt = {1};
  step05::testing::expect_paged_generation_identical("cuda", llm::load_checkpoint(model_path), prompt, 120);
}

TEST(CudaPagedKvCache, OutOfBlocksIsAClearErrorAndThePoolStaysIntact) {
  LLM_REQUIRE_CUDA_DEVICE();
  const llm::ModelWeights weights = llm::random_weights(llm::find_preset("tiny").config, 7);
  auto model = step05::make_paged_model_on("cuda", weights);
  step05::PagedKvCacheOptions options;
  options.num_sequences = 2;
  options.n_blocks = 3;
  options.block_size = 4;
  auto cache = step05::make_paged_kv_cache("cuda", weights.config, options);
  const std::vector<int> prompt = llm::testing::random_tokens(13, weights.config.vocab_size, 5);
  EXPECT_THROW(model->forward(llm::TokenBatch::prefill(prompt, 0, 0), *cache), llm::KvCacheFullError);
  EXPECT_EQ(cache->blocks().free_blocks(), 3);
  cache->blocks().check_invariants();
  const std::vector<int> short_prompt(prompt.begin(), prompt.begin() + 6);
  auto contiguous_model = llm::make_model_on("cuda", weights);
  auto contiguous = contiguous_model->make_cache(1, 12);
  EXPECT_EQ(step05::greedy_in_slot(*model, *cache, 0, short_prompt, 0, 12).tokens,
            step05::greedy_in_slot(*contiguous_model, *contiguous, 0, short_prompt, 0, 12).tokens);
}

}  // namespace
