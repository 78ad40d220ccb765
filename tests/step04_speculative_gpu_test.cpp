// Step 04 on CUDA: greedy speculative decoding with the target and the model
// drafters on the GPU is token-for-token plain greedy decoding on the GPU.
// Skips with the reason where no GPU can be present, fails where one is
// present but unusable (LLM_REQUIRE_CUDA_DEVICE, tests/test_support.hpp).
#include <gtest/gtest.h>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/harness/compare.hpp"
#include "step01_kv_cache/generation.hpp"
#include "step04_speculative/early_exit_drafter.hpp"
#include "step04_speculative/ngram_drafter.hpp"
#include "step04_speculative/speculative_decoder.hpp"
#include "test_support.hpp"

namespace {

TEST(step04SpeculativeGpu, GreedyIdenticalToPlainDecodingOnCuda) {
  LLM_REQUIRE_CUDA_DEVICE();

  const auto weights = llm::random_weights(llm::find_preset("tiny").config, 42);
  auto target = llm::cuda::make_cuda_model(weights);
  const std::vector<int> prompt = {1, 40, 77};
  const int positions = 120;
  llm::Sampler plain_sampler(weights.config.vocab_size, 0.0f, 0.9f, 42);
  const auto plain = step01::generate_cached(*target, prompt, positions, plain_sampler);

  std::vector<std::unique_ptr<step04::Drafter>> drafters;
  drafters.push_back(step04::make_early_exit_drafter(
      weights, 2, [](const llm::ModelWeights& w) { return llm::cuda::make_cuda_model(w); }));
  drafters.push_back(std::make_unique<step04::NgramDrafter>(3, weights.config.vocab_size));
  for (auto& drafter : drafters) {
    step04::SpeculativeDecoder decoder(*target, *drafter);
    for (int k : {1, 3, 6}) {
      llm::Sampler rng(weights.config.vocab_size, 0.0f, 0.9f, 42);
      const auto spec = decoder.generate(prompt, positions, k, {0.0f, 0.0f}, rng);
      const auto check = llm::compare_tokens(spec.tokens, plain.tokens);
      EXPECT_TRUE(check.ok) << drafter->name() << " k=" << k << ": " << check.summary();
    }
  }
}

}  // namespace
