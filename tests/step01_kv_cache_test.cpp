// Step 01: generation with a KV cache must equal generation by recomputation,
// token for token, with logits within fp32 model tolerance; bad requests fail
// with a clear error.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "llm/checkpoint.hpp"
#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "llm/tokenizer.hpp"
#include "step01_kv_cache/generation.hpp"
#include "step01_kv_cache/measure/runc_comparison.hpp"
#include "test_support.hpp"

namespace {

using step01::GenerationResult;

GenerationResult run(step01::GenerateFn fn, llm::Model& model, const std::vector<int>& prompt, int positions,
                     float temperature = 0.0f) {
  llm::Sampler sampler(model.config().vocab_size, temperature, 0.9f, 7);
  return fn(model, prompt, positions, sampler);
}

void expect_same_generation(const GenerationResult& cached, const GenerationResult& recomputed) {
  ASSERT_EQ(cached.tokens, recomputed.tokens);
  const auto error = llm::compare(cached.logits, recomputed.logits, llm::model_logits_tolerance(llm::DType::F32));
  EXPECT_TRUE(error.ok) << error.summary();
}

TEST(Step01, CachedEqualsRecomputeOnTheTinyPresetFromBos) {
  // Seed 42 is the executable's default; its greedy text does not hit BOS early.
  llm::CpuModel model(llm::random_weights(llm::find_preset("tiny").config, 42));
  const std::vector<int> prompt = {llm::Tokenizer::kBos};
  const auto cached = run(step01::generate_cached, model, prompt, 40);
  const auto recomputed = run(step01::generate_recompute, model, prompt, 40);
  EXPECT_EQ(cached.tokens.size(), 40u);  // positions 0..39, one token each
  expect_same_generation(cached, recomputed);
}

TEST(Step01, CachedEqualsRecomputeWithAPromptAndSampling) {
  llm::CpuModel model(llm::random_weights(llm::find_preset("tiny").config, 5));
  const std::vector<int> prompt = {1, 40, 77, 300, 12, 9, 511};
  // Same seed, same logits up to float noise: the sampled tokens agree too.
  const auto cached = run(step01::generate_cached, model, prompt, 30, 0.8f);
  const auto recomputed = run(step01::generate_recompute, model, prompt, 30, 0.8f);
  EXPECT_EQ(cached.tokens.size(), 30u - prompt.size() + 1);
  expect_same_generation(cached, recomputed);
}

TEST(Step01, CacheAllocatesExactlyTheFormulaBytes) {
  const auto config = llm::find_preset("tiny").config;
  llm::CpuModel model(llm::random_weights(config, 1));
  const auto cached = run(step01::generate_cached, model, {llm::Tokenizer::kBos}, 100);
  EXPECT_EQ(cached.kv_bytes_allocated,
            step01::kv_cache_bytes(config.n_layers, config.n_kv_heads, config.head_dim(), 100, sizeof(float)));
  // Llama-2-7B in fp16 at 4k: 2 x 32 x 32 x 128 x 4096 x 2 bytes = 2 GiB.
  EXPECT_EQ(step01::kv_cache_bytes(32, 32, 128, 4096, 2), 2ull << 30);
}

// The two formulas of the step (exercise ex01.2), against numbers worked out
// by hand from the architecture, not from the code under test.
TEST(Step01Formulas, KvCacheBytesOfPublishedModels) {
  // Llama-2-7B in fp16 at 4k positions: 2 x 32 layers x 32 heads x 128 x 4096 x 2 bytes = 2 GiB.
  EXPECT_EQ(step01::kv_cache_bytes(32, 32, 128, 4096, 2), 2ull << 30);
  // Llama-3-8B (GQA, 8 KV heads) in fp16 at 8k: 2 x 32 x 8 x 128 x 8192 x 2 = 1 GiB.
  EXPECT_EQ(step01::kv_cache_bytes(32, 8, 128, 8192, 2), 1ull << 30);
  // TinyLlama-1.1B in fp32 at one position: 2 x 22 x 4 x 64 x 4 = 45056 bytes.
  EXPECT_EQ(step01::kv_cache_bytes(22, 4, 64, 1, 4), 45056u);
  // Past 4 GiB the product must not overflow 32 bits: 2 x 80 x 8 x 128 x 131072 x 2 = 40 GiB.
  EXPECT_EQ(step01::kv_cache_bytes(80, 8, 128, 131072, 2), 40ull << 30);
  EXPECT_EQ(step01::kv_cache_bytes(5, 4, 8, 0, 4), 0u);
}

TEST(Step01Formulas, DecodeBytesPerTokenCountsEveryWeightOnceAndTheCachedContext) {
  for (const bool shared : {true, false}) {
    // dim 64, hidden 172, 5 layers, 8 heads (head_dim 8), 4 KV heads, vocab 512.
    const auto config = llm::make_config(64, 172, 5, 8, 4, 512, 512, shared);
    const std::size_t per_layer = 64 * 64            // wq
                                  + 2 * 64 * 32      // wk, wv (kv_dim 4 x 8 = 32)
                                  + 64 * 64          // wo
                                  + 3 * 64 * 172     // w1, w2, w3
                                  + 2 * 64;          // the two RMSNorm weights
    // The classifier [512, 64] is read whole; the embedding table only for
    // the token's row, unless it is the classifier (then it is counted once).
    const std::size_t weights = 5 * per_layer + 64 /* final norm */ + 512 * 64 + (shared ? 0 : 64);
    const std::size_t kv_per_position = 2 * 5 * 32 * 4;  // K and V, fp32
    EXPECT_EQ(step01::decode_bytes_per_token(config, 0), weights * 4) << "shared " << shared;
    EXPECT_EQ(step01::decode_bytes_per_token(config, 100), weights * 4 + 100 * kv_per_position);
    EXPECT_EQ(step01::decode_bytes_per_token(config, 100, 2), weights * 2 + 100 * kv_per_position);
  }
}

TEST(Step01, RequestsBeyondTheContextAreRefused) {
  auto config = llm::find_preset("tiny").config;
  config.seq_len = 16;
  llm::CpuModel model(llm::random_weights(config, 1));
  const std::vector<int> long_prompt(17, 5);
  for (auto fn : {step01::generate_cached, step01::generate_recompute}) {
    EXPECT_THROW(run(fn, model, long_prompt, 16), llm::InputError);
    EXPECT_THROW(run(fn, model, {llm::Tokenizer::kBos}, 17), llm::InputError);
    EXPECT_THROW(run(fn, model, {}, 8), llm::InputError);
    EXPECT_THROW(run(fn, model, {1, 9999}, 8), llm::InputError);  // token id out of range
  }
}

TEST(Step01, Stories260KCachedEqualsRecomputeForAFullStory) {
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  llm::CpuModel model(llm::load_checkpoint(model_path));
  const std::vector<int> prompt = {llm::Tokenizer::kBos};
  const auto cached = run(step01::generate_cached, model, prompt, 128);
  const auto recomputed = run(step01::generate_recompute, model, prompt, 128);
  expect_same_generation(cached, recomputed);
}

TEST(Step01, VariantTableHasTheBaselineAtIdZero) {
  const auto& table = step01::variants();
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0].id, 0);
  EXPECT_EQ(table[0].fn, &step01::generate_recompute);
  EXPECT_EQ(table[1].fn, &step01::generate_cached);
}

// --- beside llama2.c's run.c ---------------------------------------------------

TEST(Step01Llama2cFiles, APresetWrittenAsLlama2cFilesLoadsBackExactly) {
  const llm::ModelWeights weights = llm::random_weights(llm::find_preset("tiny").config, 42);
  const llm::LoadedModel loaded{"preset tiny", weights, llm::Tokenizer::byte_level(weights.config.vocab_size)};
  const auto files = step01::write_llama2c_files(loaded, llm::testing::temp_path("step01_tiny.bin"));
  EXPECT_EQ(files.tokenizer, llm::testing::temp_path("step01_tiny.tokenizer.bin"));
  const llm::ModelWeights reloaded = llm::load_checkpoint(files.checkpoint);
  EXPECT_EQ(reloaded.token_embedding, weights.token_embedding);
  EXPECT_EQ(reloaded.layers.back().w2, weights.layers.back().w2);
  EXPECT_EQ(reloaded.final_norm, weights.final_norm);
  const llm::Tokenizer tokenizer = llm::Tokenizer::load(files.tokenizer, weights.config.vocab_size);
  for (int id = 0; id < 259; ++id) ASSERT_EQ(tokenizer.piece(id), loaded.tokenizer.piece(id));
  EXPECT_EQ(tokenizer.piece(300), "<unused300>");  // run.c cannot read the empty piece of an unused id
}

// A stand-in for run.c: a shell script that prints its arguments (as the
// "text") and a speed line on stderr, as run.c does.
std::string fake_runc(const std::string& name, const std::string& body) {
  return llm::testing::write_shell_script(name, body);
}

TEST(Step01Runc, PassesTheFilesGreedilyAndReadsTheSpeedAndTheText) {
  const std::string run = fake_runc("fake run's.sh", R"(printf '%s|' "$@"; echo 'achieved tok/s: 123.5' >&2; echo)");
  const step01::Llama2cFiles files{"/models/it's.bin", "/models/tok.bin"};
  const step01::RuncRun result = step01::run_runc(run, files, 17);
  EXPECT_DOUBLE_EQ(result.tokens_per_s, 123.5);
  EXPECT_EQ(result.text, "/models/it's.bin|-z|/models/tok.bin|-t|0|-n|17|\n");
}

TEST(Step01Runc, AProgramWithoutASpeedLineIsAnError) {
  const std::string run = fake_runc("not_runc.sh", "echo hello");
  try {
    step01::run_runc(run, {"a.bin", "a.tokenizer.bin"}, 4);
    FAIL() << "expected an InputError";
  } catch (const llm::InputError& e) {
    EXPECT_TRUE(llm::testing::HasSubstr(e.what(), "achieved tok/s"));
  }
}

TEST(Step01Runc, AFailingProgramIsAnErrorWithItsStatusAndOutput) {
  const std::string run = fake_runc("failing_runc.sh", "echo \"Couldn't open file\"; exit 3");
  try {
    step01::run_runc(run, {"missing.bin", "missing.tokenizer.bin"}, 4);
    FAIL() << "expected an InputError";
  } catch (const llm::InputError& e) {
    EXPECT_TRUE(llm::testing::HasSubstr(e.what(), "exit status 3"));
    EXPECT_TRUE(llm::testing::HasSubstr(e.what(), "Couldn't open file"));
  }
}

TEST(Step01Runc, TheMedianOfAnEvenNumberOfRunsIsTheMeanOfTheMiddleTwo) {
  // Each call prints the next speed from a counter file: 10, 20, 30, 40, 50
  // (the first is the warm-up, not counted).
  const std::string counter = llm::testing::temp_path("runc_counter");
  std::remove(counter.c_str());
  const std::string run = fake_runc(
      "counting_runc.sh", "n=$(cat '" + counter + "' 2>/dev/null || echo 0); n=$((n + 10)); echo $n > '" + counter +
                              "'; echo \"achieved tok/s: $n\" >&2");
  const step01::RuncMeasurement m = step01::measure_runc(run, {"a.bin", "a.tokenizer.bin"}, 4, 4);
  EXPECT_EQ(m.tokens_per_s, (std::vector<double>{20, 30, 40, 50}));
  EXPECT_DOUBLE_EQ(m.median_tokens_per_s, 35.0);
}

}  // namespace
