// The reference CpuModel: the KV cache changes nothing but speed, every way of
// batching the same tokens gives the same logits, bad batches are rejected,
// random weights give sane activations; and the Sampler.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "llm/config.hpp"
#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "llm/parallel_for.hpp"
#include "llm/sampler.hpp"
#include "llm/weights.hpp"
#include "test_support.hpp"

namespace llm {
namespace {

using ::llm::testing::HasSubstr;
using ::llm::testing::random_tokens;

::testing::AssertionResult matches_f32(std::span<const float> got, std::span<const float> ref) {
  const CompareResult r = compare(got, ref, tolerance_for(DType::F32));
  if (r.ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << r.summary();
}

std::vector<float> copy(std::span<const float> s) { return {s.begin(), s.end()}; }

// Row r of a [rows, vocab] logits block.
std::span<const float> row(const std::vector<float>& logits, int r, int vocab) {
  return std::span<const float>(logits).subspan(static_cast<std::size_t>(r) * vocab, static_cast<std::size_t>(vocab));
}

// Not a power of two anywhere: head_dim 8, GQA 6/3, separate classifier.
ModelConfig odd_config() {
  return make_config(/*dim=*/48, /*hidden_dim=*/100, /*n_layers=*/3, /*n_heads=*/6, /*n_kv_heads=*/3,
                     /*vocab_size=*/300, /*seq_len=*/64, /*shared_classifier=*/false);
}

ModelConfig config_named(const std::string& name) { return name == "odd" ? odd_config() : find_preset(name).config; }

// --- the model on the tiny preset and on the odd config ---------------------

class CpuModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  CpuModelTest() : weights_(random_weights(config_named(GetParam()), 42)), model_(weights_) {}

  const ModelConfig& config() const { return weights_.config; }
  int vocab() const { return config().vocab_size; }

  // Logits of the last token after prefilling `tokens` into a fresh cache.
  std::vector<float> fresh_prefill_logits(const std::vector<int>& tokens, LogitsFor which = LogitsFor::LastRowOfEachSequence) {
    auto cache = model_.make_cache(1, config().seq_len);
    return copy(model_.forward(TokenBatch::prefill(tokens, 0, 0), *cache, which));
  }

  ModelWeights weights_;
  CpuModel model_;
};

TEST_P(CpuModelTest, GreedyWithCacheEqualsRecomputingThePrefixEachStep) {
  std::vector<int> tokens = random_tokens(4, vocab(), 1);
  auto cache = model_.make_cache(1, config().seq_len);
  std::vector<float> logits = copy(model_.forward(TokenBatch::prefill(tokens, 0, 0), *cache));
  for (int step = 0; step < 16; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    // No cache: the whole prefix again, from scratch.
    const std::vector<float> recomputed = fresh_prefill_logits(tokens);
    ASSERT_TRUE(matches_f32(logits, recomputed));
    const int next = argmax(logits);
    ASSERT_EQ(next, argmax(recomputed));
    tokens.push_back(next);
    logits = copy(model_.forward(TokenBatch::single(next, static_cast<int>(tokens.size()) - 1, 0), *cache));
  }
  EXPECT_EQ(cache->length(0), static_cast<int>(tokens.size()));
}

TEST_P(CpuModelTest, OnePrefillEqualsOneDecodeStepPerToken) {
  const std::vector<int> tokens = random_tokens(9, vocab(), 2);
  auto cache = model_.make_cache(1, config().seq_len);
  std::vector<float> step_logits;
  for (int pos = 0; pos < static_cast<int>(tokens.size()); ++pos)
    step_logits = copy(model_.forward(TokenBatch::single(tokens[pos], pos, 0), *cache));
  const std::vector<float> prefill_logits = fresh_prefill_logits(tokens);
  ASSERT_EQ(prefill_logits.size(), static_cast<std::size_t>(vocab()));
  EXPECT_TRUE(matches_f32(prefill_logits, step_logits));
}

TEST_P(CpuModelTest, AllRowsGivesEveryPositionsStepByStepLogits) {
  const std::vector<int> tokens = random_tokens(7, vocab(), 3);
  const int n = static_cast<int>(tokens.size());
  const std::vector<float> all = fresh_prefill_logits(tokens, LogitsFor::AllRows);
  ASSERT_EQ(all.size(), static_cast<std::size_t>(n) * vocab());
  auto cache = model_.make_cache(1, config().seq_len);
  for (int pos = 0; pos < n; ++pos) {
    SCOPED_TRACE("row " + std::to_string(pos));
    const std::vector<float> step = copy(model_.forward(TokenBatch::single(tokens[pos], pos, 0), *cache));
    EXPECT_TRUE(matches_f32(row(all, pos, vocab()), step));
  }
}

// What one sequence of a mixed batch contributes: a cached prefix (run
// beforehand), then its rows in the batch.
struct SequenceWork {
  std::vector<int> prefix;
  std::vector<int> rows;
};

TEST_P(CpuModelTest, MixedBatchOfPrefillAndDecodeRowsEqualsSeparateRuns) {
  const std::vector<SequenceWork> work = {
      {random_tokens(5, vocab(), 4), random_tokens(1, vocab(), 5)},  // decode
      {random_tokens(2, vocab(), 6), random_tokens(6, vocab(), 7)},  // chunked prefill after a prefix
      {random_tokens(3, vocab(), 8), random_tokens(1, vocab(), 9)},  // decode
      {{}, random_tokens(4, vocab(), 10)},                           // prefill from position 0
  };
  // Each sequence alone: its own cache, prefix then rows.
  std::vector<std::vector<float>> alone, alone_all_rows;
  for (const SequenceWork& w : work) {
    auto cache = model_.make_cache(1, config().seq_len);
    if (!w.prefix.empty()) model_.forward(TokenBatch::prefill(w.prefix, 0, 0), *cache);
    alone_all_rows.push_back(
        copy(model_.forward(TokenBatch::prefill(w.rows, static_cast<int>(w.prefix.size()), 0), *cache, LogitsFor::AllRows)));
    alone.push_back(copy(row(alone_all_rows.back(), static_cast<int>(w.rows.size()) - 1, vocab())));
  }
  // Decode rows first (no gather), and interleaved with prefill runs (gather).
  for (const std::vector<int>& order : {std::vector<int>{0, 2, 1, 3}, std::vector<int>{1, 0, 3, 2}}) {
    for (const LogitsFor which : {LogitsFor::LastRowOfEachSequence, LogitsFor::AllRows}) {
      SCOPED_TRACE("order " + std::to_string(order[0]) + std::to_string(order[1]) + std::to_string(order[2]) +
                   std::to_string(order[3]) + (which == LogitsFor::AllRows ? ", all rows" : ", last rows"));
      auto cache = model_.make_cache(static_cast<int>(work.size()), config().seq_len);
      for (int s = 0; s < static_cast<int>(work.size()); ++s)
        if (!work[s].prefix.empty()) model_.forward(TokenBatch::prefill(work[s].prefix, 0, s), *cache);
      TokenBatch batch;
      for (int s : order)
        for (std::size_t i = 0; i < work[s].rows.size(); ++i)
          batch.add(work[s].rows[i], static_cast<int>(work[s].prefix.size() + i), s);
      const std::vector<float> logits = copy(model_.forward(batch, *cache, which));
      int out_row = 0;
      for (int s : order) {
        const int n_rows = which == LogitsFor::AllRows ? static_cast<int>(work[s].rows.size()) : 1;
        for (int r = 0; r < n_rows; ++r, ++out_row) {
          SCOPED_TRACE("sequence " + std::to_string(s) + ", row " + std::to_string(r));
          const auto want = which == LogitsFor::AllRows ? row(alone_all_rows[s], r, vocab()) : std::span<const float>(alone[s]);
          EXPECT_TRUE(matches_f32(row(logits, out_row, vocab()), want));
        }
        EXPECT_EQ(cache->length(s), static_cast<int>(work[s].prefix.size() + work[s].rows.size()));
      }
      EXPECT_EQ(logits.size(), static_cast<std::size_t>(out_row) * vocab());
    }
  }
}

TEST_P(CpuModelTest, TruncateThenReforwardReproducesTheLogits) {
  const std::vector<int> prompt = random_tokens(6, vocab(), 11);
  const std::vector<int> draft = random_tokens(3, vocab(), 12);
  const std::vector<int> other = random_tokens(2, vocab(), 13);
  const int n = static_cast<int>(prompt.size());
  auto cache = model_.make_cache(1, config().seq_len);
  model_.forward(TokenBatch::prefill(prompt, 0, 0), *cache);
  const std::vector<float> draft_logits = copy(model_.forward(TokenBatch::prefill(draft, n, 0), *cache, LogitsFor::AllRows));
  EXPECT_EQ(cache->length(0), n + 3);

  // Reject the draft: roll back, continue differently.
  cache->truncate(0, n);
  EXPECT_EQ(cache->length(0), n);
  const std::vector<float> other_logits = copy(model_.forward(TokenBatch::prefill(other, n, 0), *cache, LogitsFor::AllRows));
  std::vector<int> prompt_then_other = prompt;
  prompt_then_other.insert(prompt_then_other.end(), other.begin(), other.end());
  const std::vector<float> fresh = fresh_prefill_logits(prompt_then_other, LogitsFor::AllRows);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("other row " + std::to_string(r));
    EXPECT_TRUE(matches_f32(row(other_logits, r, vocab()), row(fresh, n + r, vocab())));
  }

  // Roll back again and replay the draft: the same logits as the first time.
  cache->truncate(0, n);
  const std::vector<float> replay = copy(model_.forward(TokenBatch::prefill(draft, n, 0), *cache, LogitsFor::AllRows));
  EXPECT_TRUE(matches_f32(replay, draft_logits));

  EXPECT_THROW(cache->truncate(0, n + 4), InputError);  // cannot grow
  EXPECT_THROW(cache->truncate(0, -1), InputError);
}

// The message of the error `forward(batch)` throws; fails the test if it does not throw E.
template <class E>
std::string forward_error(Model& model, const TokenBatch& batch, KvCache& cache) {
  try {
    model.forward(batch, cache);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "forward did not throw";
  return "";
}

TEST_P(CpuModelTest, RejectsBadBatchesWithoutTouchingTheCache) {
  auto cache = model_.make_cache(2, config().seq_len);
  model_.forward(TokenBatch::prefill(random_tokens(3, vocab(), 14), 0, 0), *cache);

  EXPECT_TRUE(HasSubstr(forward_error<InputError>(model_, TokenBatch::single(vocab(), 3, 0), *cache), "out of range"));
  EXPECT_TRUE(HasSubstr(forward_error<InputError>(model_, TokenBatch::single(-1, 3, 0), *cache), "out of range"));
  EXPECT_TRUE(HasSubstr(forward_error<InputError>(model_, TokenBatch::single(5, 4, 0), *cache), "gap"));
  EXPECT_TRUE(HasSubstr(forward_error<InputError>(model_, TokenBatch::single(5, 1, 1), *cache), "gap"));
  EXPECT_TRUE(HasSubstr(forward_error<InputError>(model_, TokenBatch::single(5, 0, 2), *cache), "does not exist"));
  EXPECT_TRUE(HasSubstr(forward_error<InputError>(model_, TokenBatch{}, *cache), "empty batch"));

  TokenBatch skips;  // positions 3, 5 of one sequence
  skips.add(5, 3, 0);
  skips.add(6, 5, 0);
  EXPECT_TRUE(HasSubstr(forward_error<InputError>(model_, skips, *cache), "not consecutive"));

  TokenBatch split;  // sequence 0's rows interrupted by sequence 1
  split.add(5, 3, 0);
  split.add(6, 0, 1);
  split.add(7, 4, 0);
  EXPECT_TRUE(HasSubstr(forward_error<InputError>(model_, split, *cache), "contiguous"));

  TokenBatch bad_last_row = TokenBatch::prefill({1, 2, 3}, 3, 0);  // a bad token after good rows
  bad_last_row.tokens.back() = vocab() + 7;
  EXPECT_TRUE(HasSubstr(forward_error<InputError>(model_, bad_last_row, *cache), "out of range"));

  // Nothing above wrote anything: the cache still continues at 3.
  EXPECT_EQ(cache->length(0), 3);
  EXPECT_EQ(cache->length(1), 0);
  EXPECT_NO_THROW(model_.forward(TokenBatch::single(5, 3, 0), *cache));
}

TEST_P(CpuModelTest, RejectsAPositionBeyondTheContext) {
  const int seq_len = config().seq_len;
  auto cache = model_.make_cache(1, seq_len);
  model_.forward(TokenBatch::prefill(random_tokens(seq_len, vocab(), 15), 0, 0), *cache);
  EXPECT_EQ(cache->length(0), seq_len);
  EXPECT_TRUE(HasSubstr(forward_error<InputError>(model_, TokenBatch::single(5, seq_len, 0), *cache), "context"));
}

TEST_P(CpuModelTest, AFullCacheThrowsKvCacheFullError) {
  auto cache = model_.make_cache(1, 4);  // shorter than the context
  model_.forward(TokenBatch::prefill(random_tokens(4, vocab(), 16), 0, 0), *cache);
  EXPECT_TRUE(HasSubstr(forward_error<KvCacheFullError>(model_, TokenBatch::single(5, 4, 0), *cache), "full"));
  cache->clear();
  EXPECT_EQ(cache->length(0), 0);
  // A prefill running past the end, too.
  EXPECT_TRUE(HasSubstr(forward_error<KvCacheFullError>(model_, TokenBatch::prefill(random_tokens(5, vocab(), 17), 0, 0), *cache),
                        "full"));
  EXPECT_EQ(cache->length(0), 0);
}

INSTANTIATE_TEST_SUITE_P(TinyAndOdd, CpuModelTest, ::testing::Values("tiny", "odd"),
                         [](const auto& param_info) { return param_info.param; });

// --- random weights keep activations sane -----------------------------------

double row_std(std::span<const float> values) {
  double mean = 0.0, sq = 0.0;
  for (float v : values) mean += v;
  mean /= static_cast<double>(values.size());
  for (float v : values) sq += (v - mean) * (v - mean);
  return std::sqrt(sq / static_cast<double>(values.size()));
}

class PresetSanityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PresetSanityTest, RandomWeightsGiveFiniteLogitsOfModerateSpread) {
  const ModelConfig& config = find_preset(GetParam()).config;
  if (config.parameter_count() >= 50'000'000)
    GTEST_SKIP() << GetParam() << " has " << config.parameter_count() << " parameters: too big for a CPU unit test";
  CpuModel model(random_weights(config, 7));
  auto cache = model.make_cache(1, 16);
  const std::vector<int> tokens = random_tokens(8, config.vocab_size, 18);
  const std::vector<float> logits = copy(model.forward(TokenBatch::prefill(tokens, 0, 0), *cache, LogitsFor::AllRows));
  for (int r = 0; r < 8; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const auto one = row(logits, r, config.vocab_size);
    EXPECT_TRUE(std::all_of(one.begin(), one.end(), [](float v) { return std::isfinite(v); }));
    const double std = row_std(one);
    EXPECT_GT(std, 0.1);
    EXPECT_LT(std, 20.0);
  }
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : presets()) names.push_back(p.name);
  return names;
}

// Test names may hold only letters, digits and '_'.
std::string test_name(const std::string& name) {
  std::string out = name;
  for (char& ch : out)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return out;
}

INSTANTIATE_TEST_SUITE_P(Presets, PresetSanityTest, ::testing::ValuesIn(preset_names()),
                         [](const auto& param_info) { return test_name(param_info.param); });

// A Linear that records its last output, to watch what each residual branch
// (wo, w2) adds to the stream.
class OutputRecordingLinear final : public Linear {
 public:
  OutputRecordingLinear(std::unique_ptr<Linear> inner, std::vector<float>* sink) : inner_(std::move(inner)), sink_(sink) {}
  void forward(const float* x, int rows, float* y) const override {
    inner_->forward(x, rows, y);
    sink_->assign(y, y + static_cast<std::size_t>(rows) * out_features());
  }
  int in_features() const override { return inner_->in_features(); }
  int out_features() const override { return inner_->out_features(); }
  std::size_t weight_bytes() const override { return inner_->weight_bytes(); }

 private:
  std::unique_ptr<Linear> inner_;
  std::vector<float>* sink_;
};

// RMS of the residual stream of one token after each layer: the embedding
// row plus every branch output so far.
std::vector<double> residual_rms_by_depth(const ModelConfig& config) {
  const ModelWeights weights = random_weights(config, 9);
  std::vector<std::vector<float>> branches(2 * static_cast<std::size_t>(config.n_layers));  // wo, w2 of each layer
  int wo_seen = 0, w2_seen = 0;
  CpuModelOptions options;
  options.linear_factory = [&](const std::vector<float>& w, int out, int in,
                               const LinearSite& site) -> std::unique_ptr<Linear> {
    auto dense = std::make_unique<DenseLinear>(w, out, in);
    if (site.role == LinearRole::Output)
      return std::make_unique<OutputRecordingLinear>(std::move(dense), &branches[2 * wo_seen++]);
    if (site.role == LinearRole::Down)
      return std::make_unique<OutputRecordingLinear>(std::move(dense), &branches[2 * w2_seen++ + 1]);
    return dense;
  };
  CpuModel model(weights, options);
  auto cache = model.make_cache(1, 4);
  const int token = 5;
  model.forward(TokenBatch::single(token, 0, 0), *cache);

  std::vector<double> x(weights.token_embedding.begin() + static_cast<std::ptrdiff_t>(token) * config.dim,
                        weights.token_embedding.begin() + static_cast<std::ptrdiff_t>(token + 1) * config.dim);
  std::vector<double> rms;
  for (int l = 0; l < config.n_layers; ++l) {
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < config.dim; ++i) x[i] += branches[2 * l + b].at(i);
    double sq = 0.0;
    for (double v : x) sq += v * v;
    rms.push_back(std::sqrt(sq / config.dim));
  }
  return rms;
}

TEST(RandomWeights, ResidualStreamRmsStaysOrderOneAtEveryDepth) {
  for (int layers : {1, 5, 48}) {
    for (bool shared : {true, false}) {
      ModelConfig config = find_preset("tiny").config;
      config.n_layers = layers;
      config.shared_classifier = shared;
      const std::vector<double> rms = residual_rms_by_depth(config);
      for (int l = 0; l < layers; ++l) {
        SCOPED_TRACE(std::to_string(layers) + " layers, " + (shared ? "shared" : "separate") + ", after layer " +
                     std::to_string(l));
        EXPECT_GT(rms[l], 0.1);
        EXPECT_LT(rms[l], 3.0);
      }
    }
  }
}

// allocate() zeroes a large model's tensors on every core (2^24 parameters
// and more), a small one's on this thread: either way every tensor has its
// shape, all of them together hold parameter_count() floats, and every value
// is zero.
TEST(ModelWeights, AllocateGivesEveryTensorItsShapeAndZeros) {
  ModelConfig large = find_preset("tiny").config;
  large.dim = 512;
  large.hidden_dim = 1376;
  large.vocab_size = 32000;
  large.shared_classifier = false;
  ASSERT_GE(large.parameter_count(), std::size_t{1} << 24);
  for (const ModelConfig& config : {find_preset("tiny").config, large}) {
    SCOPED_TRACE(::testing::Message() << config.parameter_count() << " parameters");
    const ModelWeights w = ModelWeights::allocate(config);
    std::size_t floats = 0;
    const auto expect_zeros = [&](const std::vector<float>& tensor, std::size_t size) {
      EXPECT_EQ(tensor.size(), size);
      EXPECT_TRUE(std::all_of(tensor.begin(), tensor.end(), [](float x) { return x == 0.0f; }));
      floats += tensor.size();
    };
    const std::size_t d = config.dim, h = config.hidden_dim, v = config.vocab_size, kv = config.kv_dim();
    const std::size_t q_width = static_cast<std::size_t>(config.n_heads) * config.head_dim();
    expect_zeros(w.token_embedding, v * d);
    expect_zeros(w.final_norm, d);
    expect_zeros(w.classifier, config.shared_classifier ? 0 : v * d);
    ASSERT_EQ(w.layers.size(), static_cast<std::size_t>(config.n_layers));
    for (const LayerWeights& layer : w.layers) {
      expect_zeros(layer.attention_norm, d);
      expect_zeros(layer.wq, q_width * d);
      expect_zeros(layer.wk, kv * d);
      expect_zeros(layer.wv, kv * d);
      expect_zeros(layer.wo, d * q_width);
      expect_zeros(layer.ffn_norm, d);
      expect_zeros(layer.w1, h * d);
      expect_zeros(layer.w2, d * h);
      expect_zeros(layer.w3, h * d);
    }
    EXPECT_EQ(floats, config.parameter_count());
  }
}

// --- parallel_for (what random_weights fills large presets with) ----------------

TEST(ParallelFor, CallsEveryIndexOnceOnAnyNumberOfThreads) {
  for (const unsigned threads : {1u, 2u, 3u, 8u, 0u}) {
    for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{100}}) {
      SCOPED_TRACE(::testing::Message() << count << " pieces on up to " << threads << " threads");
      std::vector<std::atomic<int>> calls(count);  // [count] how often each index ran
      parallel_for(count, [&](std::size_t index) { ++calls[index]; }, threads);
      for (std::size_t index = 0; index < count; ++index) EXPECT_EQ(calls[index].load(), 1) << "index " << index;
    }
  }
}

// Two pieces throw: every other piece still runs, and the exception that
// comes out is the lowest index's, the one a plain loop would have met first,
// even when it is thrown last (piece 5 waits before it throws).
TEST(ParallelFor, RethrowsTheLowestIndexsExceptionOnceEveryPieceRan) {
  for (const unsigned threads : {1u, 4u}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    std::vector<std::atomic<int>> calls(20);  // [20]
    try {
      parallel_for(
          calls.size(),
          [&](std::size_t index) {
            ++calls[index];
            if (index == 5) std::this_thread::sleep_for(std::chrono::milliseconds(50));
            if (index == 13 || index == 5) throw InputError("piece " + std::to_string(index));
          },
          threads);
      FAIL() << "a throwing piece must not be swallowed";
    } catch (const InputError& error) {
      EXPECT_STREQ(error.what(), "piece 5");
    }
    for (std::size_t index = 0; index < calls.size(); ++index) EXPECT_EQ(calls[index].load(), 1) << index;
  }
}

// --- Sampler --------------------------------------------------------------------

TEST(Sampler, TemperatureZeroIsArgmax) {
  Sampler sampler(300, 0.0f, 0.9f, 1);
  for (unsigned seed = 0; seed < 20; ++seed) {
    const auto logits = testing::random_vector(300, seed, 5.0f);
    EXPECT_EQ(sampler.sample(logits), argmax(logits));
  }
}

std::vector<int> draw(Sampler& sampler, const std::vector<float>& logits, int n) {
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(sampler.sample(logits));
  return out;
}

TEST(Sampler, SameSeedGivesTheSameSequence) {
  const auto logits = testing::random_vector(300, 19, 2.0f);
  for (const float top_p : {1.0f, 0.9f}) {
    SCOPED_TRACE("top_p " + std::to_string(top_p));
    Sampler a(300, 1.0f, top_p, 1234), b(300, 1.0f, top_p, 1234), c(300, 1.0f, top_p, 1235);
    const std::vector<int> seq_a = draw(a, logits, 64);
    EXPECT_EQ(seq_a, draw(b, logits, 64));
    EXPECT_NE(seq_a, draw(c, logits, 64));
    EXPECT_GT(std::set<int>(seq_a.begin(), seq_a.end()).size(), 10u);  // it does sample, not argmax
  }
}

TEST(Sampler, TinyTopPPicksTheArgmax) {
  Sampler sampler(300, 1.0f, 0.0001f, 5);
  for (unsigned seed = 0; seed < 20; ++seed) {
    const auto logits = testing::random_vector(300, 100 + seed, 3.0f);
    EXPECT_EQ(sampler.sample(logits), argmax(logits));
  }
}

TEST(Sampler, TinyTopPPicksTheArgmaxOfANearlyFlatDistribution) {
  // One logit 1e-3 above 299 zeros: the most likely token has probability
  // 0.0033367, just above 1/n but below the top-p pre-filter's cutoff
  // (1 - top_p) / (n - 1) = 0.0033441. It must still be the one picked.
  Sampler sampler(300, 1.0f, 0.0001f, 5);
  for (int best : {0, 1, 123, 299}) {
    std::vector<float> logits(300, 0.0f);
    logits[static_cast<std::size_t>(best)] = 1e-3f;
    EXPECT_EQ(sampler.sample(logits), best);
  }
  EXPECT_EQ(sampler.sample(std::vector<float>(300, 0.0f)), 0);  // all tied: the first
}

// Frequencies of 20000 draws from logits = log p.
std::vector<double> frequencies(Sampler& sampler, const std::vector<double>& p) {
  std::vector<float> logits;
  for (double v : p) logits.push_back(static_cast<float>(std::log(v)));
  std::vector<double> freq(p.size(), 0.0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) freq[static_cast<std::size_t>(sampler.sample(logits))] += 1.0 / n;
  return freq;
}

TEST(Sampler, DrawsMatchAKnownDistribution) {
  const std::vector<double> p = {0.4, 0.25, 0.15, 0.1, 0.06, 0.04};
  Sampler sampler(6, 1.0f, 1.0f, 2024);
  const std::vector<double> freq = frequencies(sampler, p);
  for (std::size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(freq[i], p[i], 0.015) << "token " << i;
}

TEST(Sampler, TopPDrawsFromTheRenormalizedNucleus) {
  // top_p 0.85: 0.4 + 0.25 + 0.15 = 0.8 is not past it, + 0.1 is: keep 4 tokens.
  const std::vector<double> p = {0.4, 0.25, 0.15, 0.1, 0.06, 0.04};
  Sampler sampler(6, 1.0f, 0.85f, 77);
  const std::vector<double> freq = frequencies(sampler, p);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_NEAR(freq[i], p[i] / 0.9, 0.015) << "token " << i;
  EXPECT_EQ(freq[4], 0.0);
  EXPECT_EQ(freq[5], 0.0);
}

TEST(Sampler, TemperatureSharpensTheDistribution) {
  // T = 0.5 squares the probabilities (then renormalizes).
  const std::vector<double> p = {0.5, 0.3, 0.2};
  Sampler sampler(3, 0.5f, 1.0f, 99);
  const std::vector<double> freq = frequencies(sampler, p);
  const double z = 0.25 + 0.09 + 0.04;
  EXPECT_NEAR(freq[0], 0.25 / z, 0.015);
  EXPECT_NEAR(freq[1], 0.09 / z, 0.015);
  EXPECT_NEAR(freq[2], 0.04 / z, 0.015);
}

TEST(Sampler, RejectsBadArguments) {
  EXPECT_THROW(Sampler(10, -1.0f, 0.9f, 1), InputError);
  EXPECT_THROW(Sampler(10, NAN, 0.9f, 1), InputError);
  EXPECT_THROW(Sampler(10, 1.0f, NAN, 1), InputError);
  Sampler sampler(10, 1.0f, 0.9f, 1);
  EXPECT_THROW(sampler.sample(std::vector<float>(11, 0.0f)), InputError);
}

TEST(Sampler, UniformNumbersLieInZeroToOne) {
  Sampler sampler(10, 1.0f, 0.9f, 0);  // seed 0 must not get stuck at zero
  double sum = 0.0;
  for (int i = 0; i < 10000; ++i) {
    const float u = sampler.next_uniform();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

}  // namespace
}  // namespace llm
