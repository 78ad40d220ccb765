// Step 04: greedy speculative decoding is token-for-token plain greedy
// decoding, for every drafter and several k, on a random preset and on
// stories260K; KV-cache rollback leaves the caches as if no draft had been
// rejected; bad settings fail with clear errors.
#include <gtest/gtest.h>

#include <memory>

#include "llm/checkpoint.hpp"
#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "step01_kv_cache/generation.hpp"
#include "step04_speculative/early_exit_drafter.hpp"
#include "step04_speculative/model_drafter.hpp"
#include "step04_speculative/ngram_drafter.hpp"
#include "step04_speculative/speculative_decoder.hpp"
#include "step04_speculative/speedup_formula.hpp"
#include "step04_speculative/variants.hpp"
#include "test_support.hpp"

namespace {

const step04::SamplingSettings kGreedy{0.0f, 0.0f};

std::unique_ptr<llm::Model> cpu_model(const llm::ModelWeights& w) { return std::make_unique<llm::CpuModel>(w); }

// A random draft that shares the tiny preset's vocabulary (512, as
// stories260K's): fewer, narrower layers and its own seed, so its guesses
// mostly miss and the rejection path is exercised a lot.
llm::ModelWeights small_random_draft() {
  llm::ModelConfig c = llm::find_preset("tiny").config;
  c.dim = 32;
  c.hidden_dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  return llm::random_weights(c, 777);
}

// Every drafter the step has, for a target.
std::vector<std::unique_ptr<step04::Drafter>> all_drafters(const llm::ModelWeights& target,
                                                           const llm::ModelWeights& draft) {
  std::vector<std::unique_ptr<step04::Drafter>> drafters;
  step04::DrafterSetup setup{&target, &draft, "random draft", 1, 3, &cpu_model};
  for (const auto& v : step04::variants()) {
    if (v.id == step04::variant_id::kPlain) {
      EXPECT_EQ(v.fn(setup), nullptr);  // the baseline has no drafter
      continue;
    }
    if (v.id == step04::variant_id::kEarlyExit) {
      for (int layers = 1; layers < target.config.n_layers; layers += 2) {
        setup.draft_layers = layers;
        drafters.push_back(v.fn(setup));
      }
    } else {
      drafters.push_back(v.fn(setup));
    }
  }
  // The target drafting for itself: every draft accepted, the all-accepted
  // path (bonus token, two-token catch-up) runs every round.
  drafters.push_back(std::make_unique<step04::ModelDrafter>("self", cpu_model(target), target.config));
  return drafters;
}

void expect_greedy_identical(const llm::ModelWeights& target_weights, const llm::ModelWeights& draft_weights,
                             const std::vector<int>& prompt, int positions) {
  llm::CpuModel target(target_weights);
  llm::Sampler plain_sampler(target_weights.config.vocab_size, 0.0f, 0.9f, 42);
  const auto plain = step01::generate_cached(target, prompt, positions, plain_sampler);
  ASSERT_GT(plain.tokens.size(), 8u);

  for (auto& drafter : all_drafters(target_weights, draft_weights)) {
    step04::SpeculativeDecoder decoder(target, *drafter);
    for (int k : {1, 2, 4, 7}) {
      llm::Sampler rng(target_weights.config.vocab_size, 0.0f, 0.9f, 42);
      const auto spec = decoder.generate(prompt, positions, k, kGreedy, rng);
      const auto check = llm::compare_tokens(spec.tokens, plain.tokens);
      EXPECT_TRUE(check.ok) << drafter->name() << " k=" << k << ": " << check.summary();
      // Fewer target passes than tokens, unless nothing was ever accepted.
      EXPECT_LE(spec.stats.rounds, static_cast<int>(spec.tokens.size()) - 1);
      EXPECT_LE(spec.stats.accepted, spec.stats.tested);
      EXPECT_LE(spec.stats.tested, spec.stats.drafted);
      if (drafter->name() == "self") EXPECT_DOUBLE_EQ(spec.stats.alpha(), 1.0) << "k=" << k;
    }
  }
}

TEST(step04SpeculativeGreedy, IdenticalToPlainDecodingOnTinyPreset) {
  const auto target = llm::random_weights(llm::find_preset("tiny").config, 42);
  expect_greedy_identical(target, small_random_draft(), {1, 40, 77, 301}, 120);
}

TEST(step04SpeculativeGreedy, IdenticalToPlainDecodingOnStories260K) {
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  const auto target = llm::load_checkpoint(model_path);
  expect_greedy_identical(target, small_random_draft(), {1}, 160);
}

// Greedy acceptance (exercise ex04.3) with the model drafters only: a random
// small draft (rejections in most rounds), early exit (long agreeing runs)
// and the target itself (every draft accepted, the bonus token every round),
// k from 1 to 6, ending exactly at the context it was given.
TEST(step04SpeculativeGreedy, IdenticalToPlainDecodingWithModelDrafters) {
  const auto target_weights = llm::random_weights(llm::find_preset("tiny").config, 19);
  const auto draft_weights = small_random_draft();
  llm::CpuModel target(target_weights);
  std::vector<std::unique_ptr<step04::Drafter>> drafters;
  drafters.push_back(std::make_unique<step04::ModelDrafter>("random draft", cpu_model(draft_weights),
                                                            target_weights.config));
  drafters.push_back(std::make_unique<step04::ModelDrafter>(
      "early exit", cpu_model(step04::early_exit_weights(target_weights, 1)), target_weights.config));
  drafters.push_back(std::make_unique<step04::ModelDrafter>("self", cpu_model(target_weights), target_weights.config));
  const std::vector<int> prompt = {1, 33, 7, 250, 9};
  for (const int positions : {6, 8, 61}) {
    llm::Sampler plain_sampler(target_weights.config.vocab_size, 0.0f, 0.9f, 3);
    const auto plain = step01::generate_cached(target, prompt, positions, plain_sampler);
    for (auto& drafter : drafters) {
      step04::SpeculativeDecoder decoder(target, *drafter);
      for (const int k : {1, 3, 6}) {
        llm::Sampler rng(target_weights.config.vocab_size, 0.0f, 0.9f, 3);
        const auto spec = decoder.generate(prompt, positions, k, kGreedy, rng);
        const auto check = llm::compare_tokens(spec.tokens, plain.tokens);
        EXPECT_TRUE(check.ok) << drafter->name() << " k=" << k << " positions " << positions << ": "
                              << check.summary();
        EXPECT_LE(spec.stats.accepted, spec.stats.tested);
        if (drafter->name() == "self") EXPECT_EQ(spec.stats.accepted, spec.stats.drafted) << "k=" << k;
        if (drafter->name() == "random draft" && positions == 61)
          EXPECT_GT(spec.stats.tested, spec.stats.accepted) << "the run must reject drafts, k=" << k;
      }
    }
  }
}

TEST(step04SpeculativeGreedy, EndsAtContextAndAtBos) {
  // total_positions close to the prompt: k is cut so nothing runs past it.
  const auto target_weights = llm::random_weights(llm::find_preset("tiny").config, 3);
  llm::CpuModel target(target_weights);
  step04::NgramDrafter ngram(2, target_weights.config.vocab_size);
  step04::SpeculativeDecoder decoder(target, ngram);
  const std::vector<int> prompt = {1, 5, 6, 5, 6, 5};
  for (int positions : {6, 7, 9}) {
    llm::Sampler plain_sampler(target_weights.config.vocab_size, 0.0f, 0.9f, 1);
    const auto plain = step01::generate_cached(target, prompt, positions, plain_sampler);
    llm::Sampler rng(target_weights.config.vocab_size, 0.0f, 0.9f, 1);
    const auto spec = decoder.generate(prompt, positions, 8, kGreedy, rng);
    EXPECT_EQ(spec.tokens, plain.tokens) << "positions " << positions;
  }
}

// --- KV-cache rollback -----------------------------------------------------

// Row-by-row K and V of positions [0, length) of a CPU cache, all layers.
std::vector<float> cache_rows(const llm::KvCache& cache_base, const llm::ModelConfig& c, int length) {
  const auto& cache = dynamic_cast<const llm::CpuKvCache&>(cache_base);
  std::vector<float> rows;
  for (int layer = 0; layer < c.n_layers; ++layer) {
    const llm::KvView view = cache.view(layer, 0);
    for (int pos = 0; pos < length; ++pos) {
      rows.insert(rows.end(), view.key_row(pos), view.key_row(pos) + c.kv_dim());
      rows.insert(rows.end(), view.value_row(pos), view.value_row(pos) + c.kv_dim());
    }
  }
  return rows;
}

TEST(step04SpeculativeRollback, TargetCacheMatchesACacheBuiltWithoutSpeculation) {
  const auto weights = llm::random_weights(llm::find_preset("tiny").config, 11);
  const llm::ModelConfig& c = weights.config;
  llm::CpuModel target(weights);
  const auto draft_weights = small_random_draft();
  step04::ModelDrafter drafter("random draft", cpu_model(draft_weights), c);  // many rejections
  step04::SpeculativeDecoder decoder(target, drafter);
  const std::vector<int> prompt = {1, 9, 8, 7};
  const int positions = 90;
  llm::Sampler rng(c.vocab_size, 0.0f, 0.9f, 1);
  const auto spec = decoder.generate(prompt, positions, 4, kGreedy, rng);
  ASSERT_GT(spec.stats.tested, spec.stats.accepted) << "the run must have rejected drafts to roll back";

  // Without speculation: plain decoding's cache holds every token but the last.
  std::vector<int> text = prompt;
  text.insert(text.end(), spec.tokens.begin(), spec.tokens.end());
  const int length = static_cast<int>(text.size()) - 1;
  ASSERT_EQ(decoder.target_cache().length(0), length);
  auto plain_cache = target.make_cache(1, positions);
  for (int pos = 0; pos < length; ++pos)
    target.forward(llm::TokenBatch::single(text[static_cast<std::size_t>(pos)], pos, 0), *plain_cache);
  // The same K/V, up to the float rounding of a (k+1)-row product against a
  // 1-row product (different summation order in Eigen).
  const auto got = cache_rows(decoder.target_cache(), c, length);
  const auto ref = cache_rows(*plain_cache, c, length);
  const auto check = llm::compare(got, ref, llm::model_logits_tolerance(llm::DType::F32));
  EXPECT_TRUE(check.ok) << check.summary();

  // The draft model's cache rolled back too: it holds a prefix of the text,
  // and that prefix's K/V are the draft model's own.
  const int draft_length = drafter.cache().length(0);
  ASSERT_LE(draft_length, length + 1);
  llm::CpuModel draft_model(draft_weights);
  auto draft_ref = draft_model.make_cache(1, positions);
  for (int pos = 0; pos < draft_length; ++pos)
    draft_model.forward(llm::TokenBatch::single(text[static_cast<std::size_t>(pos)], pos, 0), *draft_ref);
  const auto draft_check = llm::compare(cache_rows(drafter.cache(), draft_weights.config, draft_length),
                                        cache_rows(*draft_ref, draft_weights.config, draft_length),
                                        llm::model_logits_tolerance(llm::DType::F32));
  EXPECT_TRUE(draft_check.ok) << draft_check.summary();
}

TEST(step04SpeculativeRollback, RejectedRowsLeaveNoTrace) {
  // Exact version of the rollback: write k rows of rejected drafts, truncate,
  // go on with the true token. The next logits are bit-for-bit those of a
  // cache that never saw the drafts, and so is every cached row.
  const auto weights = llm::random_weights(llm::find_preset("tiny").config, 5);
  llm::CpuModel model(weights);
  const std::vector<int> prefix = {1, 20, 30, 40, 50};
  const int n = static_cast<int>(prefix.size());
  auto clean = model.make_cache(1, 32);
  auto speculated = model.make_cache(1, 32);
  model.forward(llm::TokenBatch::prefill(prefix, 0, 0), *clean);
  model.forward(llm::TokenBatch::prefill(prefix, 0, 0), *speculated);

  llm::TokenBatch rejected;  // 4 draft rows the target will not keep
  for (int i = 0; i < 4; ++i) rejected.add(100 + i, n + i, 0);
  model.forward(rejected, *speculated, llm::LogitsFor::AllRows);
  speculated->truncate(0, n);

  const auto next = llm::TokenBatch::single(60, n, 0);
  const std::vector<float> clean_logits = [&] {
    auto l = model.forward(next, *clean);
    return std::vector<float>(l.begin(), l.end());
  }();
  const auto speculated_logits = model.forward(next, *speculated);
  EXPECT_EQ(clean_logits, std::vector<float>(speculated_logits.begin(), speculated_logits.end()));
  EXPECT_EQ(clean->length(0), speculated->length(0));
  EXPECT_EQ(cache_rows(*clean, weights.config, n + 1), cache_rows(*speculated, weights.config, n + 1));
}

// --- the drafters ------------------------------------------------------------

TEST(step04NgramDrafter, ProposesWhatFollowedTheMostRecentOccurrence) {
  step04::NgramDrafter drafter(2, 512);
  llm::Sampler rng(512, 0.0f, 0.0f, 1);
  step04::Draft draft;
  // Last two tokens (7, 8) occurred at 1..2 (followed by 9, 10) and at 5..6
  // (followed by 11, 12, 7, 8): the most recent wins.
  const std::vector<int> context = {1, 7, 8, 9, 10, 7, 8, 11, 12, 7, 8};
  drafter.propose(context, 3, kGreedy, rng, draft);
  EXPECT_EQ(draft.tokens, (std::vector<int>{11, 12, 7}));
  EXPECT_EQ(draft.steps, 1);
  // An occurrence near the end: the copy runs on into its own proposal
  // (4 at position 1 is followed by 5, 4, then the 5 just proposed).
  drafter.propose(std::vector<int>{1, 4, 5, 4}, 3, kGreedy, rng, draft);
  EXPECT_EQ(draft.tokens, (std::vector<int>{5, 4, 5}));
  // No occurrence of any suffix: nothing.
  drafter.propose(std::vector<int>{1, 2, 3}, 3, kGreedy, rng, draft);
  EXPECT_TRUE(draft.tokens.empty());
  // Sampling mode: one-hot q rows.
  drafter.propose(context, 2, {1.0f, 0.0f}, rng, draft);
  ASSERT_EQ(draft.probabilities.size(), 2u * 512u);
  EXPECT_EQ(draft.probabilities[11], 1.0f);
  EXPECT_EQ(draft.probabilities[512 + 12], 1.0f);
}

// The search order (exercise ex04.2): the longest suffix first (down to one
// token), its most recent EARLIER occurrence (never the suffix itself), and
// the copy running on into its own proposal. Expected drafts by hand.
TEST(step04NgramDrafter, FallsBackToShorterSuffixesAndNeverMatchesItself) {
  step04::NgramDrafter drafter(3, 512);
  llm::Sampler rng(512, 0.0f, 0.0f, 1);
  step04::Draft draft;
  // (9, 2, 3) never occurred before; (2, 3) did, at 1..2, followed by 9, 2, 3
  // and then the copy's own first token.
  drafter.propose(std::vector<int>{1, 2, 3, 9, 2, 3}, 4, kGreedy, rng, draft);
  EXPECT_EQ(draft.tokens, (std::vector<int>{9, 2, 3, 9}));
  EXPECT_EQ(draft.steps, 1);
  // Only the last token (8) occurred before, at 1: what followed it.
  drafter.propose(std::vector<int>{5, 8, 6, 7, 8}, 2, kGreedy, rng, draft);
  EXPECT_EQ(draft.tokens, (std::vector<int>{6, 7}));
  // (5, 6) at 1..2 wins over the more recent single 6 at 4: longer first.
  drafter.propose(std::vector<int>{4, 5, 6, 1, 6, 9, 5, 6}, 2, kGreedy, rng, draft);
  EXPECT_EQ(draft.tokens, (std::vector<int>{1, 6}));
  // One token: no earlier occurrence of anything.
  drafter.propose(std::vector<int>{7}, 3, kGreedy, rng, draft);
  EXPECT_TRUE(draft.tokens.empty());
  EXPECT_EQ(draft.steps, 1);
  // (7) at 0 is followed by the 7 at 1, then by the copy itself: 7, 7, 7.
  drafter.propose(std::vector<int>{7, 7}, 3, kGreedy, rng, draft);
  EXPECT_EQ(draft.tokens, (std::vector<int>{7, 7, 7}));
  // k = 1: one token, from the most recent occurrence of (3, 4) (at 4..5).
  drafter.propose(std::vector<int>{3, 4, 10, 0, 3, 4, 11, 3, 4}, 1, kGreedy, rng, draft);
  EXPECT_EQ(draft.tokens, (std::vector<int>{11}));
}

TEST(step04EarlyExitDrafter, KeepsTheFirstLayersAndTheTargetsHead) {
  const auto target = llm::random_weights(llm::find_preset("tiny").config, 8);
  const auto draft = step04::early_exit_weights(target, 2);
  EXPECT_EQ(draft.config.n_layers, 2);
  EXPECT_EQ(draft.layers[1].wq, target.layers[1].wq);
  EXPECT_EQ(draft.final_norm, target.final_norm);
  EXPECT_EQ(draft.classifier_matrix(), target.classifier_matrix());
}

// --- bad input -----------------------------------------------------------------

TEST(step04SpeculativeErrors, MismatchedVocabularyIsRefused) {
  const auto target = llm::random_weights(llm::find_preset("tiny").config, 1);
  llm::ModelConfig other = small_random_draft().config;
  other.vocab_size = 300;
  const auto draft = llm::random_weights(other, 2);
  step04::DrafterSetup setup{&target, &draft, "other.bin", 1, 3, &cpu_model};
  try {
    step04::variants()[step04::variant_id::kDraftModel].fn(setup);
    FAIL() << "a draft with another vocabulary was accepted";
  } catch (const llm::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary of 300 tokens but the target has 512"), std::string::npos)
        << e.what();
  }
}

TEST(step04SpeculativeErrors, DraftLayersOutOfRangeAndBadK) {
  const auto target_weights = llm::random_weights(llm::find_preset("tiny").config, 1);
  EXPECT_THROW(step04::early_exit_weights(target_weights, 0), llm::InputError);
  EXPECT_THROW(step04::early_exit_weights(target_weights, target_weights.config.n_layers), llm::InputError);
  EXPECT_THROW(step04::NgramDrafter(0, 512), llm::InputError);
  llm::CpuModel target(target_weights);
  step04::NgramDrafter ngram(3, 512);
  step04::SpeculativeDecoder decoder(target, ngram);
  llm::Sampler rng(512, 0.0f, 0.0f, 1);
  EXPECT_THROW(decoder.generate(std::vector<int>{1}, 20, 0, kGreedy, rng), llm::InputError);
  EXPECT_THROW(decoder.generate(std::vector<int>{1}, 20, -3, kGreedy, rng), llm::InputError);
}

// --- the formula -----------------------------------------------------------------

TEST(step04SpeedupFormula, ExpectedTokensAndSpeedup) {
  EXPECT_DOUBLE_EQ(step04::expected_tokens_per_pass(0.0, 4), 1.0);  // nothing accepted: the target's own token
  EXPECT_DOUBLE_EQ(step04::expected_tokens_per_pass(1.0, 4), 5.0);  // everything accepted + bonus
  EXPECT_NEAR(step04::expected_tokens_per_pass(0.8, 4), (1 - std::pow(0.8, 5)) / 0.2, 1e-12);
  // alpha 0.8, k 5, c 0.05: E = (1 - 0.8^6) / 0.2 = 3.69 tokens per pass, speedup 3.69 / 1.25 = 2.95x.
  EXPECT_NEAR(step04::textbook_speedup(0.8, 5, 0.05), 3.6893 / 1.25, 1e-3);
  // Averaged over rounds of k drafts with v = 1, the prediction is the textbook one.
  const auto p = step04::predict_speedup(0.7, std::vector<int>(10, 3), std::vector<int>(10, 3), 0.1,
                                         {1.0, 1.0, 1.0, 1.0});
  EXPECT_NEAR(p.speedup, step04::textbook_speedup(0.7, 3, 0.1), 1e-12);
  // best_k: a free, always-right drafter wants the longest draft; a useless one the shortest.
  EXPECT_EQ(step04::best_k(1.0, 0.0, {1.0}, 8), 8);
  EXPECT_EQ(step04::best_k(0.0, 0.1, {1.0}, 8), 1);
}

}  // namespace
