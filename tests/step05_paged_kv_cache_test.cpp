// Step 05's paged KV cache behind the KvCache hook: copy-on-write at the K/V
// level, the pool after running out of blocks, bytes counted once when
// shared, and greedy generation through it identical to step 01's
// contiguous cache (stories260K when the file is present, the tiny preset
// always).
#include <gtest/gtest.h>

#include <numeric>
#include <ostream>

#include "llm/checkpoint.hpp"
#include "llm/config.hpp"
#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/weights.hpp"
#include "step05_paged_attention/measure/paged_generation.hpp"
#include "step05_paged_attention/paged_kv_cache.hpp"
#include "step05_paged_attention/measure/prefix_sharing.hpp"
#include "step05_generation_checks.hpp"
#include "test_support.hpp"

namespace llm {
// Without a printer GoogleTest shows the parameter as "1-byte object <01>" in
// the test's CTest name; the element's name is clearer and stable.
void PrintTo(KvElement element, std::ostream* out) { *out << (element == KvElement::Int8 ? "int8" : "fp32"); }
}  // namespace llm

namespace {

using llm::KvElement;
using step05::PagedKvCache;
using step05::PagedKvCacheOptions;

llm::ModelConfig tiny_config() { return llm::find_preset("tiny").config; }

std::unique_ptr<PagedKvCache> cpu_cache(const llm::ModelConfig& config, int sequences, int blocks, int block_size,
                                        KvElement element = KvElement::Float32) {
  PagedKvCacheOptions options;
  options.num_sequences = sequences;
  options.n_blocks = blocks;
  options.block_size = block_size;
  options.element = element;
  return step05::make_paged_kv_cache("cpu", config, options);
}

// Writes `n` rows of fresh random K/V (seeded by `seed` and the position) at
// positions first..first+n-1 of `sequence`, in every layer, as a forward
// would: reserve, prepare, store through the view, mark written.
void write_rows(PagedKvCache& cache, const llm::ModelConfig& config, int sequence, int first, int n,
                std::uint64_t seed) {
  cache.reserve(sequence, first, first + n);
  cache.prepare();
  for (int layer = 0; layer < config.n_layers; ++layer) {
    const llm::KvView view = cache.view(layer, sequence);
    for (int pos = first; pos < first + n; ++pos) {
      const auto key = llm::testing::random_vector(static_cast<std::size_t>(config.kv_dim()), seed + 1000 * pos + layer);
      const auto value =
          llm::testing::random_vector(static_cast<std::size_t>(config.kv_dim()), seed + 1000 * pos + layer + 500);
      llm::store_kv_row(view, pos, key.data(), value.data());
    }
  }
  cache.mark_written(sequence, first + n - 1);
}

// Every row (all layers, K then V) of positions 0..n-1 of a sequence.
std::vector<float> read_rows(const PagedKvCache& cache, const llm::ModelConfig& config, int sequence, int n) {
  std::vector<float> rows;
  std::vector<float> key(static_cast<std::size_t>(config.kv_dim())), value(key.size());
  for (int layer = 0; layer < config.n_layers; ++layer)
    for (int pos = 0; pos < n; ++pos) {
      llm::load_kv_row(cache.view(layer, sequence), pos, key.data(), value.data());
      rows.insert(rows.end(), key.begin(), key.end());
      rows.insert(rows.end(), value.begin(), value.end());
    }
  return rows;
}

class CopyOnWrite : public ::testing::TestWithParam<KvElement> {};

// A fork shares the parent's blocks; each one's writes after the fork land
// in its own copy of the shared, partly filled last block, never in the other's.
TEST_P(CopyOnWrite, WritingAForkedSequenceNeverChangesTheOther) {
  const llm::ModelConfig config = tiny_config();
  const int block_size = 8;
  auto cache = cpu_cache(config, 2, 8, block_size, GetParam());
  write_rows(*cache, config, 0, 0, 11, 1);  // one full block and 3 rows of the next
  const std::vector<float> parent_before = read_rows(*cache, config, 0, 11);
  cache->fork(0, 1);
  EXPECT_EQ(cache->length(1), 11);
  EXPECT_EQ(cache->blocks().used_blocks(), 2) << "the fork copies nothing until someone writes";
  EXPECT_EQ(read_rows(*cache, config, 1, 11), parent_before);

  write_rows(*cache, config, 1, 11, 4, 2);  // the child writes into the shared last block
  EXPECT_EQ(cache->blocks().counters().copy_on_write, 1);
  EXPECT_EQ(read_rows(*cache, config, 0, 11), parent_before) << "the parent's rows changed under the child's write";
  const std::vector<float> child = read_rows(*cache, config, 1, 11);
  EXPECT_EQ(child, parent_before) << "the child lost the prefix it shared";

  write_rows(*cache, config, 0, 11, 2, 3);  // now the parent writes: its block is private again, no copy
  EXPECT_EQ(cache->blocks().counters().copy_on_write, 1);
  EXPECT_EQ(read_rows(*cache, config, 1, 11), child);
  // A rewrite after a rollback inside the shared full block copies it too.
  cache->truncate(1, 5);
  write_rows(*cache, config, 1, 5, 1, 4);
  EXPECT_EQ(cache->blocks().counters().copy_on_write, 2);
  EXPECT_EQ(read_rows(*cache, config, 0, 11), parent_before)
      << "a rewrite of the child's shared first block reached the parent";
  cache->blocks().check_invariants();
}

INSTANTIATE_TEST_SUITE_P(Elements, CopyOnWrite, ::testing::Values(KvElement::Float32, KvElement::Int8),
                         [](const auto& info) { return ::testing::PrintToString(info.param); });

TEST(PagedKvCache, OutOfBlocksIsAClearErrorAndThePoolStaysIntact) {
  const llm::ModelWeights weights = llm::random_weights(tiny_config(), 7);
  llm::CpuModel model(weights);
  auto cache = cpu_cache(weights.config, 2, 3, 4);  // 12 positions in all
  const std::vector<int> prompt = llm::testing::random_tokens(13, weights.config.vocab_size, 5);
  try {
    model.forward(llm::TokenBatch::prefill(prompt, 0, 0), *cache);
    FAIL() << "a 13-token prefill fit in 3 blocks of 4";
  } catch (const llm::KvCacheFullError& error) {
    EXPECT_TRUE(llm::testing::HasSubstr(error.what(), "4")) << error.what();
    EXPECT_TRUE(llm::testing::HasSubstr(error.what(), "3")) << error.what();
  }
  EXPECT_EQ(cache->length(0), 0);
  EXPECT_EQ(cache->blocks().free_blocks(), 3);
  cache->blocks().check_invariants();
  // The pool still serves what fits, with the right tokens.
  const std::vector<int> short_prompt(prompt.begin(), prompt.begin() + 6);
  auto contiguous = model.make_cache(1, 12);
  const auto expected = step05::greedy_in_slot(model, *contiguous, 0, short_prompt, 0, 12).tokens;
  EXPECT_EQ(step05::greedy_in_slot(model, *cache, 0, short_prompt, 0, 12).tokens, expected);
  // A second sequence finds the pool full: the error, and the first one intact.
  EXPECT_THROW(model.forward(llm::TokenBatch::prefill(short_prompt, 0, 1), *cache), llm::KvCacheFullError);
  EXPECT_EQ(cache->length(0), 12);
  cache->blocks().check_invariants();
}

TEST(PagedKvCache, SharedRowsAreCountedOnceInBytesInUse) {
  const llm::ModelConfig config = tiny_config();
  auto cache = cpu_cache(config, 2, 8, 4);
  write_rows(*cache, config, 0, 0, 10, 1);
  const std::size_t one = cache->bytes_in_use();
  EXPECT_EQ(one, cache->bytes_per_block() / 4 * 10);
  cache->fork(0, 1);
  EXPECT_EQ(cache->bytes_in_use(), one);
  write_rows(*cache, config, 1, 10, 1, 2);  // copies block 2 (rows 8, 9) and adds row 10
  EXPECT_EQ(cache->bytes_in_use(), cache->bytes_per_block() / 4 * (10 + 3));
  EXPECT_EQ(cache->bytes_allocated(), cache->bytes_per_block() * 8);
}

TEST(PagedKvCache, APrefixHitLeavesTheLastPromptTokenToCompute) {
  const llm::ModelConfig config = tiny_config();
  auto cache = cpu_cache(config, 3, 16, 4);
  std::vector<int> tokens(12);
  std::iota(tokens.begin(), tokens.end(), 3);
  write_rows(*cache, config, 0, 0, 12, 1);
  cache->publish(0, tokens);
  EXPECT_EQ(cache->share_cached_prefix(1, tokens), 8) << "12 cached positions, but the 12th token must run";
  EXPECT_EQ(cache->length(1), 8);
  const std::vector<int> other = {3, 4, 5, 6, 99, 100};
  EXPECT_EQ(cache->share_cached_prefix(2, other), 4);
  EXPECT_THROW(cache->share_cached_prefix(1, tokens), llm::InputError) << "slot 1 is not empty";
  EXPECT_THROW(cache->publish(0, std::vector<int>(5, 1)), llm::InputError) << "fewer tokens than positions";
}

TEST(PagedKvCache, BadOptionsAreClearErrors) {
  const llm::ModelConfig config = tiny_config();
  EXPECT_THROW(cpu_cache(config, 1, 0, 4), llm::InputError);
  EXPECT_THROW(cpu_cache(config, 1, 4, 0), llm::InputError);
  EXPECT_THROW(cpu_cache(config, 0, 4, 4), llm::InputError);
  PagedKvCacheOptions options;
  options.n_blocks = 4;
  EXPECT_THROW(step05::make_paged_kv_cache("tpu", config, options), llm::InputError);
  auto cache = cpu_cache(config, 1, 4, 4);
  EXPECT_THROW(cache->view(config.n_layers, 0), llm::InputError);
  EXPECT_THROW(cache->reserve(1, 0, 1), llm::InputError);
}

TEST(PagedGeneration, TinyPresetGreedyTokensMatchTheContiguousCache) {
  const llm::ModelWeights weights = llm::random_weights(tiny_config(), 42);
  const std::vector<int> prompt = {1, 300, 20, 7};
  step05::testing::expect_paged_generation_identical("cpu", weights, prompt, 70);
}

TEST(PagedGeneration, Stories260KGreedyTokensMatchTheContiguousCache) {
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  const llm::ModelWeights weights = llm::load_checkpoint(model_path);
  const std::vector<int> prompt = {1};
  step05::testing::expect_paged_generation_identical("cpu", weights, prompt, 120);
}

TEST(PrefixSharing, HitsComputeFewerRowsAndGenerateTheSameTokens) {
  const llm::ModelWeights weights = llm::random_weights(tiny_config(), 42);
  auto paged = step05::make_paged_model_on("cpu", weights);
  step05::PrefixSharingOptions options;
  options.n_requests = 3;
  options.system_prompt_tokens = 40;
  options.question_tokens = 5;
  options.generated_tokens = 4;
  options.block_size = 8;
  options.repeats = 1;
  const std::vector<int> opening = {1};
  const auto prompts = step05::make_shared_prefix_prompts(*paged, opening, options);
  ASSERT_EQ(prompts.size(), 3u);
  EXPECT_EQ(prompts[0].size(), 45u);
  const auto result = step05::run_prefix_sharing("cpu", *paged, prompts, options);
  EXPECT_TRUE(result.identical);
  EXPECT_EQ(result.without_sharing.prefill_rows, 3 * 45);
  EXPECT_EQ(result.with_sharing.cached_positions, 40);  // 5 full blocks of the 40-token system prompt
  EXPECT_EQ(result.with_sharing.prefill_rows, 45 + 2 * 5);
  EXPECT_LT(result.with_sharing.blocks_used, result.without_sharing.blocks_used);
  EXPECT_EQ(result.with_sharing.ttft_hit.runs, 2);
}

}  // namespace
