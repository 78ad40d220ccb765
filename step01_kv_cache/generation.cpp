#include "step01_kv_cache/generation.hpp"

#include <fmt/format.h>

#include "llm/errors.hpp"
#include "llm/exercise.hpp"
#include "llm/harness/timer.hpp"
#include "llm/tokenizer.hpp"

namespace step01 {
namespace {

// Reserves the result's buffers up front so no reallocation lands inside a
// timed step.
void reserve(GenerationResult& result, const llm::Model& model, std::span<const int> prompt, int total_positions) {
  const auto n = static_cast<std::size_t>(total_positions - static_cast<int>(prompt.size()) + 1);
  result.prompt_length = static_cast<int>(prompt.size());
  result.tokens.reserve(n);
  result.token_ms.reserve(n);
  // The kept logits ([n, vocab], 128 KB per token at a 32000 vocabulary) are
  // written once now, then emptied: the first write to a fresh page costs a
  // page fault (the kernel zeroes the page), and taking 32 of those inside
  // every generated token would charge the decode loop for the step's own
  // bookkeeping.
  result.logits.resize(n * static_cast<std::size_t>(model.config().vocab_size));
  result.logits.clear();
}

// Samples from `logits`, records the token and its logits. Returns false when
// generation should stop (BOS sampled).
bool accept(GenerationResult& result, std::span<const float> logits, llm::Sampler& sampler, double ms) {
  const int next = sampler.sample(logits);
  result.tokens.push_back(next);
  result.logits.insert(result.logits.end(), logits.begin(), logits.end());
  result.token_ms.push_back(ms);
  return next != llm::Tokenizer::kBos;
}

}  // namespace

GenerationResult generate_recompute(llm::Model& model, std::span<const int> prompt, int total_positions,
                                    llm::Sampler& sampler) {
  llm::validate_generation(model.config(), prompt, total_positions);
  GenerationResult result;
  reserve(result, model, prompt, total_positions);
  // sequence: [n] every token so far, prompt then generated.
  std::vector<int> sequence(prompt.begin(), prompt.end());
  // One slot as long as the context, cleared every step: "no cache" means
  // nothing survives from one token to the next.
  auto scratch = model.make_cache(1, model.config().seq_len);
  llm::Stopwatch total;
  // The last forward runs at position total_positions - 1 (as llama2.c's loop).
  while (static_cast<int>(sequence.size()) <= total_positions) {
    llm::Stopwatch step;
    scratch->clear();
    const auto logits = model.forward(llm::TokenBatch::prefill(sequence, 0, 0), *scratch);
    if (!accept(result, logits, sampler, step.elapsed_ms())) break;
    sequence.push_back(result.tokens.back());
  }
  result.total_ms = total.elapsed_ms();
  return result;
}

GenerationResult generate_cached(llm::Model& model, std::span<const int> prompt, int total_positions,
                                 llm::Sampler& sampler) {
  llm::validate_generation(model.config(), prompt, total_positions);
  GenerationResult result;
  reserve(result, model, prompt, total_positions);
  // Capacity exactly what this generation needs: the cache's size is the
  // formula's 2 x layers x kv_dim x positions x 4 bytes.
  auto cache = model.make_cache(1, total_positions);
  result.kv_bytes_allocated = cache->bytes_allocated();
  llm::Stopwatch total;

  // BEGIN EXERCISE ex01.1
  // Prefill: the whole prompt in one forward; its last row predicts token 1.
  llm::Stopwatch step;
  auto logits = model.forward(llm::TokenBatch::prefill(prompt, 0, 0), *cache);
  bool go_on = accept(result, logits, sampler, step.elapsed_ms());

  // Decode: one row per step, reusing the same batch object (no allocation).
  llm::TokenBatch batch = llm::TokenBatch::single(0, 0, 0);
  int position = static_cast<int>(prompt.size());
  while (go_on && position < total_positions) {
    step.restart();
    batch.tokens[0] = result.tokens.back();
    batch.positions[0] = position;
    logits = model.forward(batch, *cache);
    go_on = accept(result, logits, sampler, step.elapsed_ms());
    ++position;
  }
  // END EXERCISE ex01.1
  result.total_ms = total.elapsed_ms();
  return result;
}

const std::vector<llm::Variant<GenerateFn>>& variants() {
  static const std::vector<llm::Variant<GenerateFn>> table = {
      {0, "recompute", "no cache: every new token re-runs the whole prefix", llm::Backend::Any,
       &generate_recompute},
      {1, "kv_cache", "prefill once, then one token per step reading cached K/V", llm::Backend::Any,
       &generate_cached},
  };
  return table;
}

std::size_t decode_bytes_per_token(const llm::ModelConfig& config, long long context, int weight_value_bytes) {
  // BEGIN EXERCISE ex01.2
  // STUB: LLM_EXERCISE_TODO("ex01.2");
  std::size_t weights = config.parameter_count();
  if (!config.shared_classifier)
    weights -= static_cast<std::size_t>(config.vocab_size - 1) * static_cast<std::size_t>(config.dim);
  return weights * static_cast<std::size_t>(weight_value_bytes) +
         static_cast<std::size_t>(context) * config.kv_bytes_per_token(sizeof(float));
  // END EXERCISE ex01.2
}

std::size_t kv_cache_bytes(int n_layers, int n_kv_heads, int head_dim, long long positions, int bytes_per_value) {
  // BEGIN EXERCISE ex01.2
  // STUB: LLM_EXERCISE_TODO("ex01.2");
  return 2ull * static_cast<std::size_t>(n_layers) * static_cast<std::size_t>(n_kv_heads) *
         static_cast<std::size_t>(head_dim) * static_cast<std::size_t>(positions) *
         static_cast<std::size_t>(bytes_per_value);
  // END EXERCISE ex01.2
}

}  // namespace step01
