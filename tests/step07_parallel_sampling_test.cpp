// Step 07's part 7, parallel sampling, on the tiny preset (CPU).
//   The part's invariants: a forked run prefills the prompt once for any n,
//     n independent requests n times; every row run is counted; the peak of
//     KV blocks equals its prediction both ways (the forked one shares the
//     prompt's full blocks), the last forward's blocks included; the
//     prompt's partial last block is copied n - 1 times, and not at all
//     when the prompt fills its blocks; the greedy
//     and sampled checks pass, and the greedy one fails against wrong solo
//     tokens (it can fail); where the forward is not batch-invariant, a
//     sampled token that differs passes only when the logits explain it
//     (rows within tolerance, the same seed's coin), not for a wrong seed or
//     logits past the tolerance.
//   The prediction by hand, and bad options refused with clear messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/config.hpp"
#include "llm/errors.hpp"
#include "llm/sampler.hpp"
#include "step05_paged_attention/measure/paged_generation.hpp"
#include "step07_batching/measure/parallel_sampling.hpp"
#include "step07_batching/measure/replay.hpp"
#include "step07_batching/measure/workload.hpp"
#include "test_support.hpp"

namespace step07 {
namespace {

llm::ModelWeights tiny_weights() { return llm::random_weights(llm::find_preset("tiny").config, 7); }

// The part on the tiny preset: a prompt of `prompt_tokens` seeded random
// ids, `max_tokens` per sample, n = 1, 3, 4, blocks of 16, 8 slots.
struct PartRun {
  Request request;
  std::vector<int> solo;
  std::vector<ParallelSamplingRow> rows;  // n = 1, 3, 4, each forked then independent
};

PartRun run_part(llm::Model& model, int prompt_tokens, int max_tokens) {
  ParallelSamplingOptions options;
  options.samples = {1, 3, 4};
  options.prompt_tokens = prompt_tokens;
  options.max_tokens = max_tokens;
  ServingLimits limits;
  limits.max_sequences = 8;
  limits.block_size = 16;
  const PromptSource prompts(nullptr, model.config().vocab_size, 5);
  PartRun run;
  run.request = parallel_sampling_request(options, prompts);
  run.solo = solo_outputs(model, {run.request}).front();
  run.rows = compare_parallel_sampling("cpu", model, run.request, run.solo, limits, options);
  return run;
}

// P = 40 ends inside its third block of 16: two full blocks shared, the
// partial one copied by every sample but one.
TEST(Step07ParallelSampling, ForkedPrefillsOnceSharesThePromptAndCopiesItsPartialBlock) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  const int prompt = 40;
  const int max_tokens = 20;  // 59 positions at the last forward: 4 blocks a sample
  const PartRun run = run_part(*model, prompt, max_tokens);
  ASSERT_EQ(run.request.prompt.size(), static_cast<std::size_t>(prompt));
  ASSERT_EQ(run.solo.size(), static_cast<std::size_t>(max_tokens)) << "the tiny preset's random weights stopped early";
  ASSERT_EQ(run.rows.size(), 6u);
  for (const ParallelSamplingRow& row : run.rows) {
    const std::string what = (row.forked ? "forked n = " : "independent n = ") + std::to_string(row.n);
    const long long n = row.n;
    EXPECT_TRUE(row.greedy.ok()) << what << ": " << row.greedy.first_difference;
    EXPECT_TRUE(row.sampled.ok()) << what << ": " << row.sampled.first_difference;
    EXPECT_TRUE(row.ok()) << what;
    EXPECT_EQ(row.generated, max_tokens) << what;
    EXPECT_EQ(row.output_tokens, n * max_tokens) << what;
    EXPECT_EQ(row.preemptions, 0) << what;
    EXPECT_EQ(row.peak_blocks, row.predicted_blocks) << what;
    EXPECT_GT(row.wall.median_ms, 0.0) << what;
    EXPECT_GT(row.tokens_per_s(), 0.0) << what;
    if (row.forked) {
      EXPECT_EQ(row.prefill_rows, prompt) << what << ": the prompt was prefilled more than once";
      EXPECT_EQ(row.rows_computed, prompt + n * (max_tokens - 1)) << what;
      EXPECT_EQ(row.peak_blocks, 2 + n * 2) << what << ": blocks 0 and 1 shared, 2 and 3 each sample's own";
      EXPECT_EQ(row.copy_on_write, n - 1) << what;
    } else {
      EXPECT_EQ(row.prefill_rows, n * prompt) << what;
      EXPECT_EQ(row.rows_computed, n * (prompt + max_tokens - 1)) << what;
      EXPECT_EQ(row.peak_blocks, n * 4) << what;
      EXPECT_EQ(row.copy_on_write, 0) << what << ": nothing shared, nothing to copy";
    }
  }
}

// P = 32 fills two blocks: the samples' first writes open new blocks, and
// nothing is copied. 18 tokens: the last forward writes position 48, the
// first of each sample's fourth block, so the peak is that forward's (the
// samples give their blocks back on it).
TEST(Step07ParallelSampling, APromptThatFillsItsBlocksIsNeverCopied) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  const PartRun run = run_part(*model, 32, 18);  // 49 positions at the last forward: 4 blocks a sample
  ASSERT_EQ(run.solo.size(), 18u) << "the tiny preset's random weights stopped early";
  for (const ParallelSamplingRow& row : run.rows) {
    const std::string what = (row.forked ? "forked n = " : "independent n = ") + std::to_string(row.n);
    EXPECT_TRUE(row.ok()) << what;
    EXPECT_EQ(row.copy_on_write, 0) << what;
    EXPECT_EQ(row.peak_blocks, row.forked ? 2 + row.n * 2 : row.n * 4) << what;
    EXPECT_EQ(row.peak_blocks, row.predicted_blocks) << what;
  }
}

// The greedy check compares with the solo tokens it is given: wrong ones fail it.
TEST(Step07ParallelSampling, TheGreedyCheckFailsAgainstWrongSoloTokens) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  ParallelSamplingOptions options;
  options.samples = {2};
  options.prompt_tokens = 20;
  options.max_tokens = 8;
  const PromptSource prompts(nullptr, weights.config.vocab_size, 5);
  const Request request = parallel_sampling_request(options, prompts);
  std::vector<int> wrong = solo_outputs(*model, {request}).front();
  wrong[3] = (wrong[3] + 1) % weights.config.vocab_size;
  const std::vector<ParallelSamplingRow> rows =
      compare_parallel_sampling("cpu", *model, request, wrong, ServingLimits{}, options);
  ASSERT_EQ(rows.size(), 2u);
  for (const ParallelSamplingRow& row : rows) {
    EXPECT_FALSE(row.greedy.ok());
    EXPECT_FALSE(row.ok());
    EXPECT_TRUE(llm::testing::HasSubstr(row.greedy.first_difference, "token 3")) << row.greedy.first_difference;
    EXPECT_TRUE(row.sampled.ok()) << "the sampled check does not read the solo tokens";
  }
}

TEST(Step07ParallelSampling, PredictedBlocksByHand) {
  // P = 200, G = 64, B = 16: 263 positions, 17 blocks a sample; 12 full prompt blocks.
  EXPECT_EQ(predicted_peak_blocks(false, 1, 200, 64, 16), 17);
  EXPECT_EQ(predicted_peak_blocks(true, 1, 200, 64, 16), 17);
  EXPECT_EQ(predicted_peak_blocks(false, 8, 200, 64, 16), 136);
  EXPECT_EQ(predicted_peak_blocks(true, 8, 200, 64, 16), 12 + 8 * 5);
  // A prompt of exactly two blocks, one token: 32 positions, nothing of its own.
  EXPECT_EQ(predicted_peak_blocks(true, 4, 32, 1, 16), 2);
  // Blocks of one position: only the prompt is shared.
  EXPECT_EQ(predicted_peak_blocks(true, 3, 10, 5, 1), 10 + 3 * 4);
}

// The sampled check where the forward is not batch-invariant, on made-up
// rows of a 4-token vocabulary: tokens 0 and 1 nearly equal (half the mass
// each), 2 and 3 far below. Swapping which of the two is a hair ahead swaps
// their order in the nucleus, so the same coin draws the other one: the
// difference rounding can make between a batched row and the row alone.
struct MadeUpRuns {
  static constexpr int kVocab = 4;
  static constexpr int kTokens = 8;
  SamplingParams sampling{1.0f, 0.9f, 1234};
  std::vector<float> alone_rows;  // [kTokens * kVocab]
  std::vector<int> alone;         // [kTokens]

  MadeUpRuns() {
    for (int t = 0; t < kTokens; ++t) alone_rows.insert(alone_rows.end(), {5.0f, 5.000001f, -10.0f, -10.0f});
    alone = draw(alone_rows, sampling.seed);
  }
  // The tokens a sampler seeded `seed` draws from `rows`, one per row.
  static std::vector<int> draw(const std::vector<float>& rows, std::uint64_t seed) {
    llm::Sampler sampler(kVocab, 1.0f, 0.9f, seed);
    std::vector<int> tokens;
    for (int t = 0; t < kTokens; ++t)
      tokens.push_back(sampler.sample(std::span<const float>(rows.data() + t * kVocab, kVocab)));
    return tokens;
  }
  OutputCheck check(const std::vector<int>& tokens, const std::vector<float>& rows, bool exact) const {
    RequestRecord record;
    record.generated = tokens;
    return check_sampled_outputs({record}, {alone}, {rows}, {alone_rows}, sampling, kVocab, exact);
  }
};

TEST(Step07ParallelSampling, SampledCheckExplainsADrawThatRoundingMoved) {
  const MadeUpRuns runs;
  std::vector<float> rows = runs.alone_rows;
  const int t = 3;
  std::swap(rows[t * MadeUpRuns::kVocab], rows[t * MadeUpRuns::kVocab + 1]);  // 1e-6 apart: within fp32's tolerance
  const std::vector<int> tokens = MadeUpRuns::draw(rows, runs.sampling.seed);
  ASSERT_NE(tokens, runs.alone) << "the swap must move the draw";

  const OutputCheck explained = runs.check(tokens, rows, /*exact=*/false);
  EXPECT_TRUE(explained.ok()) << explained.first_difference;
  EXPECT_EQ(explained.explained, 1);
  EXPECT_TRUE(llm::testing::HasSubstr(explained.first_explained, "token 3")) << explained.first_explained;
  EXPECT_TRUE(llm::testing::HasSubstr(explained.first_explained, "within the fp32 tolerance"))
      << explained.first_explained;

  const OutputCheck exact = runs.check(tokens, rows, /*exact=*/true);
  EXPECT_FALSE(exact.ok()) << "a batch-invariant device must give the alone tokens bit for bit";
  EXPECT_TRUE(llm::testing::HasSubstr(exact.first_difference, "token 3")) << exact.first_difference;
}

TEST(Step07ParallelSampling, SampledCheckFailsAWrongSeedOnTheSameLogits) {
  const MadeUpRuns runs;
  const std::vector<int> tokens = MadeUpRuns::draw(runs.alone_rows, runs.sampling.seed + 1);
  ASSERT_NE(tokens, runs.alone) << "another seed's coins must draw another token somewhere in 8";
  const OutputCheck check = runs.check(tokens, runs.alone_rows, /*exact=*/false);
  EXPECT_FALSE(check.ok());
  EXPECT_EQ(check.explained, 0);
  EXPECT_TRUE(llm::testing::HasSubstr(check.first_difference, "draws")) << check.first_difference;
}

TEST(Step07ParallelSampling, SampledCheckFailsLogitsPastTheTolerance) {
  const MadeUpRuns runs;
  // The first token the alone run drew as 1; here token 0 leads by 4 logits
  // there, so the nucleus is token 0 alone and the draw differs.
  const auto first_one = std::find(runs.alone.begin(), runs.alone.end(), 1);
  ASSERT_NE(first_one, runs.alone.end());
  const auto t = static_cast<std::size_t>(first_one - runs.alone.begin());
  std::vector<float> rows = runs.alone_rows;
  rows[t * MadeUpRuns::kVocab] = 9.0f;
  const std::vector<int> tokens = MadeUpRuns::draw(rows, runs.sampling.seed);
  ASSERT_NE(tokens, runs.alone);
  const OutputCheck check = runs.check(tokens, rows, /*exact=*/false);
  EXPECT_FALSE(check.ok());
  EXPECT_TRUE(llm::testing::HasSubstr(check.first_difference, "past the fp32 tolerance")) << check.first_difference;
}

TEST(Step07ParallelSampling, BadOptionsAreRefusedWithTheirFlags) {
  const int max_sequences = 8;
  const int context = 512;
  const auto refusal = [&](const ParallelSamplingOptions& options) -> std::string {
    try {
      check_parallel_sampling_options(options, max_sequences, context);
    } catch (const llm::InputError& error) {
      return error.what();
    }
    return "";
  };
  ParallelSamplingOptions options;
  EXPECT_EQ(refusal(options), "") << "the defaults fit the tiny preset";
  options.samples = {1, 9};
  EXPECT_TRUE(llm::testing::HasSubstr(refusal(options), "n = 9 needs 1..8")) << refusal(options);
  options.samples = {};
  EXPECT_TRUE(llm::testing::HasSubstr(refusal(options), "--samples needs at least one n")) << refusal(options);
  options.samples = {4};
  options.prompt_tokens = 500;
  options.max_tokens = 14;
  EXPECT_TRUE(llm::testing::HasSubstr(refusal(options), "need 513 positions, more than the model's context of 512"))
      << refusal(options);
  options.max_tokens = 13;
  EXPECT_EQ(refusal(options), "") << "512 positions fit";
}

}  // namespace
}  // namespace step07
