// Step 03 (grouped-query attention), CPU: the two decode-attention variants
// against common's reference for groups 1, 2, 4, 8 and MQA at awkward
// lengths and through a paged block table; the KV-head conversions (MHA by
// duplication is exact, mean-pooling averages heads); the real model through
// the new kernels; the cache formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "llm/sampler.hpp"
#include "step03_gqa/measure/conversion_experiment.hpp"
#include "llm/harness/cpu_cache_flush.hpp"
#include "step03_gqa/gqa_attention.hpp"
#include "step03_gqa/kv_cache_sizes.hpp"
#include "step03_gqa/kv_heads_conversion.hpp"
#include "step03_gqa/measure/decode_attention_sweep.hpp"
#include "test_support.hpp"

namespace step03 {
namespace {

// K/V of several sequences in one block pool, the blocks handed out in a
// shuffled order, so a kernel that ignores the block table reads wrong rows.
struct PagedKv {
  int block_size;
  int kv_dim;
  std::vector<float> keys;                       // [n_blocks, block_size, kv_dim]
  std::vector<float> values;                     // [n_blocks, block_size, kv_dim]
  std::vector<std::vector<std::int32_t>> tables; // [n_seqs][blocks of that sequence]
  std::vector<llm::KvView> views;                // [n_seqs]

  PagedKv(const std::vector<int>& lengths, int kv_dim_, int block_size_, std::uint64_t seed, float scale)
      : block_size(block_size_), kv_dim(kv_dim_) {
    int n_blocks = 0;
    for (int len : lengths) n_blocks += (len + block_size - 1) / block_size;
    keys = llm::testing::random_vector(static_cast<std::size_t>(n_blocks) * block_size * kv_dim, seed, scale);
    values = llm::testing::random_vector(keys.size(), seed + 1, 1.0f);
    std::vector<std::int32_t> order(static_cast<std::size_t>(n_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(seed)));
    std::size_t next = 0;
    for (int len : lengths) {
      std::vector<std::int32_t> table;
      for (int b = 0; b < (len + block_size - 1) / block_size; ++b) table.push_back(order[next++]);
      tables.push_back(std::move(table));
    }
    for (const auto& table : tables) {
      llm::KvView v;
      v.keys = keys.data();
      v.values = values.data();
      v.block_table = table.data();
      v.block_size = block_size;
      v.kv_dim = kv_dim;
      views.push_back(v);
    }
  }
};

struct AttentionCase {
  int n_heads, n_kv_heads, head_dim, block_size;
  std::vector<int> lengths;  // one per sequence
  float key_scale;           // larger: peakier softmax (large-magnitude scores)
};

void PrintTo(const AttentionCase& c, std::ostream* os);  // below: readable names in ctest output

std::string case_name(const AttentionCase& c) {
  std::string name = "q" + std::to_string(c.n_heads) + "_kv" + std::to_string(c.n_kv_heads) + "_hd" +
                     std::to_string(c.head_dim) + "_bs" + std::to_string(c.block_size) + "_len";
  for (int l : c.lengths) name += "_" + std::to_string(l);
  return name + (c.key_scale > 1.0f ? "_peaky" : "");
}

void PrintTo(const AttentionCase& c, std::ostream* os) { *os << case_name(c); }

class Step03DecodeAttentionTest : public ::testing::TestWithParam<AttentionCase> {
 protected:
  // out [n_seqs, n_heads, head_dim] of `fn` on this case's fresh random inputs.
  std::vector<float> run(llm::cpu::DecodeAttentionFn fn) {
    const AttentionCase& c = GetParam();
    const PagedKv kv(c.lengths, c.n_kv_heads * c.head_dim, c.block_size, 11, c.key_scale);
    const std::size_t row = static_cast<std::size_t>(c.n_heads) * c.head_dim;
    const auto q = llm::testing::random_vector(c.lengths.size() * row, 12, 1.0f);  // [n_seqs, n_heads, head_dim]
    std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());    // poisoned
    fn({c.n_heads, c.n_kv_heads, c.head_dim}, q.data(), kv.views, c.lengths, out.data());
    return out;
  }
};

TEST_P(Step03DecodeAttentionTest, BothVariantsMatchTheReference) {
  const auto reference = run(&llm::cpu::reference_decode_attention);
  for (const auto& v : variants()) {
    const auto got = run(v.fn.cpu);
    const auto check = llm::compare(got, reference, llm::tolerance_for(llm::DType::F32));
    EXPECT_TRUE(check.ok) << v.name << ": " << check.summary();
  }
}

TEST_P(Step03DecodeAttentionTest, GroupAwareEqualsRepeatKv) {
  const auto repeated = run(&repeat_kv_decode_attention);
  const auto grouped = run(&group_aware_decode_attention);
  const auto check = llm::compare(grouped, repeated, llm::tolerance_for(llm::DType::F32));
  EXPECT_TRUE(check.ok) << check.summary();
}

std::vector<AttentionCase> attention_cases() {
  std::vector<AttentionCase> cases;
  // 8 query heads: groups 1, 2, 4 and 8 (= MQA), odd lengths, blocks of 16
  // (lengths that are not block multiples), three sequences per call.
  for (int kv : {8, 4, 2, 1}) {
    cases.push_back({8, kv, 16, 16, {1, 7, 33}, 1.0f});
    cases.push_back({8, kv, 64, 16, {257, 5}, 1.0f});
    cases.push_back({8, kv, 16, 1000, {129}, 1.0f});  // one contiguous block, like CpuKvCache
  }
  // Llama-like: 32 query heads, head_dim 128, groups 8 and 32 (MQA).
  cases.push_back({32, 4, 128, 64, {333}, 1.0f});
  cases.push_back({32, 1, 128, 64, {1, 95}, 1.0f});
  // Large-magnitude scores: a nearly one-hot softmax.
  cases.push_back({8, 2, 32, 16, {77}, 12.0f});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Step03Groups, Step03DecodeAttentionTest, ::testing::ValuesIn(attention_cases()),
                         [](const auto& info) { return case_name(info.param); });

TEST(Step03Variants, TableHasTheBaselineAndTheGroupAwareVariant) {
  const auto& table = variants();
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0].id, 0);
  EXPECT_EQ(table[0].name, "repeat_kv");
  EXPECT_EQ(table[1].id, 1);
  EXPECT_EQ(table[1].name, "group_aware");
  for (const auto& v : table) {
    EXPECT_NE(v.fn.cpu, nullptr);
    EXPECT_NE(v.fn.cuda, nullptr);
  }
}

TEST(Step03Variants, RejectKvHeadsThatDoNotDivideTheQueryHeads) {
  const PagedKv kv({4}, 3 * 8, 4, 1, 1.0f);
  const auto q = llm::testing::random_vector(8 * 8, 2);
  std::vector<float> out(q.size());
  const int lengths[1] = {4};
  EXPECT_THROW(group_aware_decode_attention({8, 3, 8}, q.data(), kv.views, lengths, out.data()), llm::InputError);
  EXPECT_THROW(repeat_kv_decode_attention({8, 3, 8}, q.data(), kv.views, lengths, out.data()), llm::InputError);
}

// ---------------------------------------------------------------------------
// KV-head conversions.

std::vector<int> some_tokens(int n, int vocab) {
  std::vector<int> tokens = {1};  // BOS
  for (int i = 1; i < n; ++i) tokens.push_back(3 + (i * 37) % (vocab - 3));
  return tokens;
}

// Logits at every position of `tokens`: [n, vocab].
std::vector<float> all_row_logits(const llm::ModelWeights& weights, const std::vector<int>& tokens) {
  llm::CpuModel model(weights);
  auto cache = model.make_cache(1, static_cast<int>(tokens.size()));
  const auto logits = model.forward(llm::TokenBatch::prefill(tokens, 0, 0), *cache, llm::LogitsFor::AllRows);
  return {logits.begin(), logits.end()};
}

void expect_mha_duplicate_reproduces(const llm::ModelWeights& original) {
  const llm::ModelWeights mha = convert_kv_heads(original, original.config.n_heads);
  EXPECT_EQ(mha.config.n_kv_heads, original.config.n_heads);
  EXPECT_EQ(mha.layers[0].wk.size(), original.layers[0].wk.size() * original.config.kv_group());
  const auto tokens = some_tokens(std::min(96, original.config.seq_len), original.config.vocab_size);
  const auto check = llm::compare(all_row_logits(mha, tokens), all_row_logits(original, tokens),
                                  llm::model_logits_tolerance(llm::DType::F32));
  EXPECT_TRUE(check.ok) << check.summary();
}

TEST(Step03Conversion, MhaByDuplicationReproducesTheLogitsOfARandomGqaModel) {
  expect_mha_duplicate_reproduces(llm::random_weights(llm::find_preset("tiny").config, 5));
}

TEST(Step03Conversion, MhaByDuplicationReproducesStories260KLogits) {
  LLM_REQUIRE_MODEL_FILE(path, "stories260K.bin");
  const llm::ModelWeights original = llm::load_checkpoint(path);
  ASSERT_EQ(original.config.n_heads, 8);
  ASSERT_EQ(original.config.n_kv_heads, 4);
  expect_mha_duplicate_reproduces(original);
}

TEST(Step03Conversion, DuplicatingThenPoolingGivesBackTheOriginalWeightsExactly) {
  const llm::ModelWeights original = llm::random_weights(llm::find_preset("tiny").config, 6);
  const llm::ModelWeights round_trip = convert_kv_heads(convert_kv_heads(original, 8), 4);
  for (std::size_t l = 0; l < original.layers.size(); ++l) {
    EXPECT_EQ(round_trip.layers[l].wk, original.layers[l].wk);  // (a + a) / 2 == a in floats
    EXPECT_EQ(round_trip.layers[l].wv, original.layers[l].wv);
    EXPECT_EQ(round_trip.layers[l].wq, original.layers[l].wq);
  }
}

TEST(Step03Conversion, MeanPoolingAveragesTheRowsOfTheHeadsItMerges) {
  const llm::ModelWeights original = llm::random_weights(llm::find_preset("tiny").config, 7);
  const llm::ModelConfig& c = original.config;  // 8 query heads, 4 KV heads, head_dim 8, dim 64
  const llm::ModelWeights mqa = convert_kv_heads(original, 1);
  const llm::ModelWeights two = convert_kv_heads(original, 2);
  const std::size_t head_floats = static_cast<std::size_t>(c.head_dim()) * c.dim;
  ASSERT_EQ(mqa.layers[0].wk.size(), head_floats);
  for (std::size_t e = 0; e < head_floats; e += 37) {
    const auto& wk = original.layers[0].wk;
    const float all4 = (wk[e] + wk[head_floats + e] + wk[2 * head_floats + e] + wk[3 * head_floats + e]) / 4.0f;
    EXPECT_NEAR(mqa.layers[0].wk[e], all4, 1e-6f);
    // Two KV heads: new head 1 is the mean of old heads 2 and 3.
    const float pair = (wk[2 * head_floats + e] + wk[3 * head_floats + e]) / 2.0f;
    EXPECT_NEAR(two.layers[0].wk[head_floats + e], pair, 1e-6f);
  }
}

// wk or wv rebuilt for new_kv_heads, written out element by element in
// double: each new head is the mean of the old heads it merges (pooling), or a
// copy of the one old head its query heads read (duplication).
std::vector<double> expected_projection(const std::vector<float>& old_rows, int old_kv_heads, int new_kv_heads,
                                        std::size_t head_floats) {
  std::vector<double> expected(static_cast<std::size_t>(new_kv_heads) * head_floats);
  for (int j = 0; j < new_kv_heads; ++j) {
    // The old heads new head j stands for: one (duplication) or old/new of them.
    const bool duplicating = new_kv_heads >= old_kv_heads;
    const int count = duplicating ? 1 : old_kv_heads / new_kv_heads;
    const int first = duplicating ? j / (new_kv_heads / old_kv_heads) : j * count;
    for (std::size_t e = 0; e < head_floats; ++e) {
      double sum = 0.0;
      for (int i = first; i < first + count; ++i) sum += old_rows[static_cast<std::size_t>(i) * head_floats + e];
      expected[static_cast<std::size_t>(j) * head_floats + e] = sum / count;
    }
  }
  return expected;
}

// Every element of wk and wv of every layer, for pooling by 2, 3 and 6 and
// duplication by 3, on a model whose head_dim (6), head counts and dim (36)
// are not powers of two, so a mixed-up stride or head index shows somewhere.
TEST(Step03Conversion, EveryElementOfEveryConvertedHeadIsTheMeanOrTheCopy) {
  const llm::ModelConfig mha_config = llm::make_config(/*dim=*/36, /*hidden_dim=*/20, /*n_layers=*/2, /*n_heads=*/6,
                                                       /*n_kv_heads=*/6, /*vocab_size=*/40, /*seq_len=*/16, true);
  llm::ModelConfig gqa_config = mha_config;
  gqa_config.n_kv_heads = 2;
  const std::vector<std::pair<llm::ModelWeights, int>> conversions = {
      {llm::random_weights(mha_config, 21), 3}, {llm::random_weights(mha_config, 22), 2},
      {llm::random_weights(mha_config, 23), 1}, {llm::random_weights(gqa_config, 24), 6},
      {llm::random_weights(gqa_config, 25), 1}};
  const std::size_t head_floats = static_cast<std::size_t>(mha_config.head_dim()) * mha_config.dim;
  for (const auto& [original, new_kv_heads] : conversions) {
    const int old_kv_heads = original.config.n_kv_heads;
    SCOPED_TRACE(std::to_string(old_kv_heads) + " -> " + std::to_string(new_kv_heads) + " KV heads");
    const llm::ModelWeights converted = convert_kv_heads(original, new_kv_heads);
    ASSERT_EQ(converted.config.n_kv_heads, new_kv_heads);
    for (std::size_t l = 0; l < original.layers.size(); ++l) {
      for (const auto& [name, old_rows, new_rows] :
           {std::tuple{"wk", &original.layers[l].wk, &converted.layers[l].wk},
            std::tuple{"wv", &original.layers[l].wv, &converted.layers[l].wv}}) {
        const auto expected = expected_projection(*old_rows, old_kv_heads, new_kv_heads, head_floats);
        ASSERT_EQ(new_rows->size(), expected.size()) << name << " of layer " << l;
        for (std::size_t x = 0; x < expected.size(); ++x)
          ASSERT_NEAR((*new_rows)[x], expected[x], 1e-6)
              << name << " of layer " << l << ", new head " << x / head_floats << ", element " << x % head_floats;
      }
      EXPECT_EQ(converted.layers[l].wq, original.layers[l].wq);  // queries and wo stay as trained
      EXPECT_EQ(converted.layers[l].wo, original.layers[l].wo);
    }
  }
}

TEST(Step03Conversion, RejectsImpossibleHeadCounts) {
  const llm::ModelWeights original = llm::random_weights(llm::find_preset("tiny").config, 8);  // 8 q, 4 kv
  EXPECT_THROW(convert_kv_heads(original, 3), llm::InputError);   // does not divide 8 query heads
  EXPECT_THROW(convert_kv_heads(original, 16), llm::InputError);  // more KV heads than query heads
  EXPECT_THROW(convert_kv_heads(original, 0), llm::InputError);
  EXPECT_NO_THROW(convert_kv_heads(original, 4));
}

TEST(Step03Conversion, KvBytesPerTokenFallExactlyWithKvHeads) {
  const llm::ModelWeights original = llm::random_weights(llm::find_preset("tiny").config, 9);
  const std::size_t per_kv_head = 2ull * original.config.n_layers * original.config.head_dim() * sizeof(float);
  for (int kv : {8, 4, 2, 1}) {
    const llm::ModelWeights w = convert_kv_heads(original, kv);
    llm::CpuModel model(w);
    const auto cache = model.make_cache(1, w.config.seq_len);
    EXPECT_EQ(cache->bytes_allocated(), per_kv_head * kv * w.config.seq_len) << kv << " KV heads";
    EXPECT_EQ(w.config.kv_bytes_per_token(), per_kv_head * kv);
  }
}

TEST(Step03Conversion, ExperimentOnStories260K) {
  LLM_REQUIRE_MODEL_FILE(path, "stories260K.bin");
  const llm::ModelWeights original = llm::load_checkpoint(path);
  const std::vector<int> prompt = {1};
  const ConversionExperiment e = run_conversion_experiment(original, prompt, 96, 0.0f, 0.9f, 42, 1);
  ASSERT_EQ(e.rows.size(), 4u);  // original, mha_duplicate, gqa_mean_pool (2), mqa_mean_pool (1)
  EXPECT_EQ(e.text.size(), 96u);
  EXPECT_EQ(e.rows[0].conversion.name, "original");
  EXPECT_EQ(e.rows[0].agreement.mean_kl, 0.0);
  EXPECT_EQ(e.rows[1].conversion.kv_heads, 8);
  EXPECT_TRUE(e.rows[1].ok) << e.rows[1].logits_vs_original.summary();
  EXPECT_LT(e.rows[1].agreement.mean_kl, 1e-9);
  EXPECT_EQ(e.rows[1].agreement.top1_agreement, 1.0);
  EXPECT_EQ(e.rows[3].conversion.kv_heads, 1);
  EXPECT_GT(e.rows[3].agreement.mean_kl, 0.0);  // pooling without uptraining changes the model
  EXPECT_EQ(e.rows[3].kv_bytes_full_context_measured * 4, e.rows[0].kv_bytes_full_context_measured);
  for (const auto& r : e.rows) EXPECT_TRUE(r.ok) << r.conversion.name;
}

// ---------------------------------------------------------------------------
// The real model through the step's kernels.

std::vector<int> greedy_tokens(llm::CpuModel& model, int n, std::vector<float>* logits_out) {
  llm::Sampler sampler(model.config().vocab_size, 0.0f, 0.9f, 1);
  auto cache = model.make_cache(1, n + 1);
  std::vector<int> tokens;
  auto logits = model.forward(llm::TokenBatch::single(1, 0, 0), *cache);
  for (int pos = 1; pos <= n; ++pos) {
    logits_out->insert(logits_out->end(), logits.begin(), logits.end());
    tokens.push_back(sampler.sample(logits));
    logits = model.forward(llm::TokenBatch::single(tokens.back(), pos, 0), *cache);
  }
  return tokens;
}

TEST(Step03RealModel, Stories260KGeneratesTheSameTextThroughBothVariants) {
  LLM_REQUIRE_MODEL_FILE(path, "stories260K.bin");
  const llm::ModelWeights weights = llm::load_checkpoint(path);
  llm::CpuModel reference(weights);
  std::vector<float> reference_logits;
  const auto expected = greedy_tokens(reference, 120, &reference_logits);
  for (const auto& v : variants()) {
    llm::CpuModelOptions options;
    options.attention.decode = v.fn.cpu;  // every decode step's attention through the variant
    llm::CpuModel model(weights, options);
    std::vector<float> logits;
    EXPECT_EQ(greedy_tokens(model, 120, &logits), expected) << v.name;
    const auto check = llm::compare(logits, reference_logits, llm::model_logits_tolerance(llm::DType::F32));
    EXPECT_TRUE(check.ok) << v.name << ": " << check.summary();
  }
}

// ---------------------------------------------------------------------------
// Sweep, cache formula, JSON (the quality measures are common's: common_quality_test).

TEST(Step03Sweep, SmallSweepChecksEveryCellAndMeasuresTheFormula) {
  SweepOptions o;
  o.n_heads = 8;
  o.head_dim = 16;
  o.kv_heads = {8, 2, 1};
  o.contexts = {5, 33};
  o.repeats = 1;
  o.flush_caches = false;
  const SweepResult r = run_decode_attention_sweep(o);
  ASSERT_EQ(r.cells.size(), 3u * 2u * 2u);  // kv_heads x contexts x variants (CPU only)
  for (const auto& c : r.cells) {
    EXPECT_TRUE(c.error.ok) << c.variant_name << " kv " << c.kv_heads << " ctx " << c.context << ": "
                            << c.error.summary();
    EXPECT_EQ(c.kv_bytes_per_token_measured, c.kv_bytes_per_token_formula);
    EXPECT_EQ(c.kv_bytes_per_token_formula, 2u * c.kv_heads * 16 * sizeof(float));
  }
}

// A default run keeps its flush buffer small (kDefaultRunFlushLimit); the
// buffer is never below 8 MiB, and an explicit size obeys the limit too.
TEST(Step03CacheFlush, TheBufferStaysWithinItsLimit) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  EXPECT_EQ(llm::CpuCacheFlusher(64 * kMiB, 16 * kMiB).bytes(), 16 * kMiB);
  EXPECT_EQ(llm::CpuCacheFlusher(1 * kMiB, 16 * kMiB).bytes(), 8 * kMiB);
  EXPECT_EQ(llm::CpuCacheFlusher(12 * kMiB, 16 * kMiB).bytes(), 12 * kMiB);
  const std::size_t from_cache_size = llm::CpuCacheFlusher(0, 16 * kMiB).bytes();  // twice the LLC, limited
  EXPECT_GE(from_cache_size, 8 * kMiB);
  EXPECT_LE(from_cache_size, 16 * kMiB);
  EXPECT_LE(llm::kDefaultRunFlushLimit, 256 * kMiB);
}

TEST(Step03CacheSizes, WellKnownModelsPerTokenBytes) {
  std::map<std::string, std::size_t> fp16_per_token;
  for (const auto& m : llm::well_known_models()) fp16_per_token[m.name] = llm::attention_config(m).kv_bytes_per_token(2);
  EXPECT_EQ(fp16_per_token["Llama-2-7B"], 2u * 32 * 32 * 128 * 2);   // 512 KiB
  EXPECT_EQ(fp16_per_token["Llama-2-70B"], 2u * 80 * 8 * 128 * 2);   // 320 KiB
  EXPECT_EQ(fp16_per_token["Llama-3-8B"], 2u * 32 * 8 * 128 * 2);    // 128 KiB
  EXPECT_EQ(fp16_per_token["Mistral-7B"], 2u * 32 * 8 * 128 * 2);
  EXPECT_EQ(sequences_that_fit(10.0, 3.0), 3);
  EXPECT_EQ(sequences_that_fit(2.0, 3.0), 0);
}

}  // namespace
}  // namespace step03
