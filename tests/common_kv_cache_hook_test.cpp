// The hooks the serving half builds on, with test doubles in place of the
// real step 05/06 code:
//   - the KV cache hook: a paged cache (fp32 or int8 rows, blocks allocated on
//     demand) handed to the unchanged CpuModel generates what the contiguous
//     cache generates; running out of blocks is a KvCacheFullError; prefix
//     adoption and truncation keep the bookkeeping right;
//   - the Linear hook: sites are named after llama2.c's tensors; a tied
//     classifier is stored once (step 06's calibration recorder, which wraps
//     every Linear of a forward, is tested in tests/step06_calibration_test.cpp).
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/linear.hpp"
#include "llm/weights.hpp"
#include "paged_kv_cache_double.hpp"
#include "test_support.hpp"

namespace llm {
namespace {

using testing::greedy_tokens;
using testing::PagedCpuKvCacheDouble;

// Prompt: BOS then a few story tokens' worth of ids (any ids in the vocabulary).
const std::vector<int> kPrompt = {1, 403, 407, 261, 378, 271, 394, 261, 425, 280, 302};
constexpr int kPositions = 96;  // crosses many 8-position blocks

TEST(KvCacheHook, PagedFp32CacheGeneratesTheContiguousTokens) {
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  CpuModel model(load_checkpoint(model_path));
  auto contiguous = model.make_cache(1, kPositions);
  const std::vector<int> expected = greedy_tokens(model, *contiguous, kPrompt, kPositions);

  PagedCpuKvCacheDouble paged(model.config(), 1, /*n_blocks=*/16, /*block_size=*/8, KvElement::Float32);
  EXPECT_EQ(greedy_tokens(model, paged, kPrompt, kPositions), expected);
  EXPECT_EQ(paged.free_blocks(), 16 - kPositions / 8);
  EXPECT_EQ(paged.bytes_in_use(), contiguous->bytes_in_use());
}

TEST(KvCacheHook, Int8CacheGeneratesTheContiguousTokensInAQuarterOfTheBytes) {
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  CpuModel model(load_checkpoint(model_path));
  auto contiguous = model.make_cache(1, kPositions);
  const std::vector<int> expected = greedy_tokens(model, *contiguous, kPrompt, kPositions);

  PagedCpuKvCacheDouble int8(model.config(), 1, 16, 8, KvElement::Int8);
  EXPECT_EQ(greedy_tokens(model, int8, kPrompt, kPositions), expected);
  // int8 values plus one fp32 scale per head: 1 + 4 / head_dim bytes per value.
  const double ratio = static_cast<double>(int8.bytes_in_use()) / static_cast<double>(contiguous->bytes_in_use());
  EXPECT_NEAR(ratio, (1.0 + 4.0 / model.config().head_dim()) / 4.0, 1e-9);
}

TEST(KvCacheHook, Int8RowsReadBackWithinHalfAScalePerHead) {
  const ModelConfig config = find_preset("tiny").config;
  PagedCpuKvCacheDouble cache(config, 1, 2, 4, KvElement::Int8);
  cache.reserve(0, 0, 3);
  cache.prepare();
  const auto key = testing::random_vector(static_cast<std::size_t>(config.kv_dim()), 7, 3.0f);
  auto value = testing::random_vector(static_cast<std::size_t>(config.kv_dim()), 8);
  for (int i = 0; i < config.head_dim(); ++i) value[static_cast<std::size_t>(i)] = 0.0f;  // an all-zero head
  const KvView view = cache.view(1, 0);
  store_kv_row(view, 2, key.data(), value.data());
  std::vector<float> key_back(key.size()), value_back(value.size());
  load_kv_row(view, 2, key_back.data(), value_back.data());
  for (int head = 0; head < config.n_kv_heads; ++head) {
    float absmax = 0.0f;
    for (int i = 0; i < config.head_dim(); ++i) absmax = std::max(absmax, std::fabs(key[head * config.head_dim() + i]));
    for (int i = 0; i < config.head_dim(); ++i) {
      const auto at = static_cast<std::size_t>(head * config.head_dim() + i);
      EXPECT_LE(std::fabs(key_back[at] - key[at]), absmax / 127.0f / 2.0f * 1.0001f);
    }
  }
  for (int i = 0; i < config.head_dim(); ++i) EXPECT_EQ(value_back[static_cast<std::size_t>(i)], 0.0f);
}

TEST(KvCacheHook, RunningOutOfBlocksIsAKvCacheFullErrorWithNumbers) {
  const ModelConfig config = find_preset("tiny").config;
  CpuModel model(random_weights(config, 3));
  PagedCpuKvCacheDouble paged(config, 2, /*n_blocks=*/3, /*block_size=*/4, KvElement::Float32);
  model.forward(TokenBatch::prefill(testing::random_tokens(8, config.vocab_size, 1), 0, 0), paged);  // 2 blocks
  try {
    model.forward(TokenBatch::prefill(testing::random_tokens(8, config.vocab_size, 2), 0, 1), paged);
    FAIL() << "a prefill needing 2 blocks with 1 free must throw";
  } catch (const KvCacheFullError& e) {
    EXPECT_TRUE(testing::HasSubstr(e.what(), "2 more blocks of 4 positions, 1 of 3 free"));
  }
  EXPECT_EQ(paged.length(1), 0);  // nothing written for the refused sequence
  paged.truncate(0, 3);           // frees the second block of sequence 0
  EXPECT_EQ(paged.free_blocks(), 2);
  model.forward(TokenBatch::prefill(testing::random_tokens(8, config.vocab_size, 2), 0, 1), paged);
  EXPECT_EQ(paged.free_blocks(), 0);
}

TEST(KvCacheHook, AdoptedPrefixContinuesLikeTheOriginal) {
  const ModelConfig config = find_preset("tiny").config;
  CpuModel model(random_weights(config, 4));
  const std::vector<int> prompt = testing::random_tokens(13, config.vocab_size, 5);
  const std::vector<int> shared(prompt.begin(), prompt.begin() + 10);
  const std::vector<int> rest(prompt.begin() + 10, prompt.end());
  for (int paged : {0, 1}) {
    SCOPED_TRACE(paged ? "paged" : "contiguous");
    std::unique_ptr<KvCache> cache = paged ? std::make_unique<PagedCpuKvCacheDouble>(config, 2, 12, 4, KvElement::Float32)
                                           : model.make_cache(2, 40);
    const std::vector<int> alone = greedy_tokens(model, *cache, prompt, 30, 0);
    cache->truncate(0, 10);
    cache->adopt_prefix(1, 0, 10);  // sequence 1 starts from sequence 0's first 10 positions
    EXPECT_EQ(cache->length(1), 10);
    EXPECT_EQ(greedy_tokens(model, *cache, rest, 30, 1), alone);
    EXPECT_THROW(cache->adopt_prefix(1, 0, 5), InputError);   // sequence 1 is not empty
    EXPECT_THROW(cache->adopt_prefix(0, 0, 1), InputError);   // a sequence cannot adopt itself
  }
}

TEST(KvCacheHook, ModelsRefuseACacheOfAnotherShapeOrKernelsThatCannotReadIt) {
  const ModelConfig config = find_preset("tiny").config;
  ModelConfig other = config;
  other.n_layers += 1;
  CpuModel model(random_weights(config, 6));
  PagedCpuKvCacheDouble wrong_shape(other, 1, 4, 4, KvElement::Float32);
  EXPECT_THROW(model.forward(TokenBatch::single(1, 0, 0), wrong_shape), InputError);

  // Kernels other than the reference read fp32 rows: an int8 cache is refused.
  cpu::AttentionKernels fp32_only;
  fp32_only.decode = [](const AttentionShape& shape, const float* q, std::span<const KvView> kv,
                        std::span<const int> lengths, float* out) {
    cpu::reference_decode_attention(shape, q, kv, lengths, out);
  };
  model.set_attention(fp32_only);
  PagedCpuKvCacheDouble int8(config, 1, 4, 4, KvElement::Int8);
  EXPECT_THROW(model.forward(TokenBatch::single(1, 0, 0), int8), InputError);
}

TEST(LinearHook, ASiteIsNamedAfterLlama2cTensors) {
  EXPECT_EQ(LinearSite({2, LinearRole::Down}).name(), "layer 2 w2");
  EXPECT_EQ(LinearSite({-1, LinearRole::Classifier}).name(), "classifier");
}

TEST(LinearHook, ATiedClassifierIsStoredOnce) {
  for (bool shared : {true, false}) {
    ModelConfig config = find_preset("tiny").config;
    config.shared_classifier = shared;
    SCOPED_TRACE(shared ? "tied" : "separate classifier");
    const CpuModel model(random_weights(config, 2));
    EXPECT_EQ(model.stored_weight_bytes(), config.parameter_count() * sizeof(float));
  }
}

}  // namespace
}  // namespace llm
