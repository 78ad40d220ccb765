#include "step03_gqa/measure/conversion_experiment.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/harness/timer.hpp"
#include "llm/sampler.hpp"
#include "llm/tokenizer.hpp"
#include "step03_gqa/kv_heads_conversion.hpp"

namespace step03 {
namespace {

// The original model continues the prompt to `positions` tokens (it may stop
// early at BOS, which delimits stories).
std::vector<int> generate_text(llm::CpuModel& model, std::span<const int> prompt, int positions, float temperature,
                               float top_p, unsigned long long seed) {
  std::vector<int> text(prompt.begin(), prompt.end());
  llm::Sampler sampler(model.config().vocab_size, temperature, top_p, seed);
  auto cache = model.make_cache(1, positions);
  auto logits = model.forward(llm::TokenBatch::prefill(text, 0, 0), *cache);
  while (static_cast<int>(text.size()) < positions) {
    const int next = sampler.sample(logits);
    if (next == llm::Tokenizer::kBos) break;
    text.push_back(next);
    if (static_cast<int>(text.size()) == positions) break;
    logits = model.forward(llm::TokenBatch::single(next, static_cast<int>(text.size()) - 1, 0), *cache);
  }
  return text;
}

// Logits at every position of `text` in one forward: [text.size(), vocab].
std::vector<float> all_logits(llm::CpuModel& model, llm::KvCache& cache, const std::vector<int>& text) {
  cache.clear();
  const auto logits = model.forward(llm::TokenBatch::prefill(text, 0, 0), cache, llm::LogitsFor::AllRows);
  return {logits.begin(), logits.end()};
}

}  // namespace

std::vector<KvHeadsConversion> conversions_for(const llm::ModelConfig& c) {
  std::vector<KvHeadsConversion> list;
  list.push_back({"original", fmt::format("as trained: {} query heads, {} KV heads", c.n_heads, c.n_kv_heads),
                  c.n_kv_heads, true});
  if (c.n_kv_heads != c.n_heads)
    list.push_back({"mha_duplicate", fmt::format("MHA: each KV head duplicated for its {} query heads", c.kv_group()),
                    c.n_heads, true});
  if (c.n_kv_heads % 2 == 0 && c.n_kv_heads / 2 > 1)
    list.push_back({"gqa_mean_pool", fmt::format("{} KV heads: pairs of KV heads mean-pooled", c.n_kv_heads / 2),
                    c.n_kv_heads / 2, false});
  if (c.n_kv_heads > 1)
    list.push_back({"mqa_mean_pool", "MQA: all KV heads of a layer mean-pooled into one", 1, false});
  return list;
}

ConversionExperiment run_conversion_experiment(const llm::ModelWeights& original, std::span<const int> prompt,
                                               int positions, float temperature, float top_p,
                                               unsigned long long seed, int repeats) {
  const llm::ModelConfig& config = original.config;
  if (prompt.empty()) throw llm::InputError("the conversion experiment needs a prompt of at least the BOS token");
  positions = std::min(positions, config.seq_len);
  if (static_cast<int>(prompt.size()) > positions)
    throw llm::InputError(fmt::format("the prompt is {} tokens, longer than the {} positions of the experiment",
                                      prompt.size(), positions));
  ConversionExperiment experiment;
  llm::CpuModel original_model(original);
  experiment.text = generate_text(original_model, prompt, positions, temperature, top_p, seed);

  std::vector<float> original_logits;  // [text, vocab]
  for (const KvHeadsConversion& conversion : conversions_for(config)) {
    const llm::ModelWeights weights = convert_kv_heads(original, conversion.kv_heads);
    llm::CpuModel model(weights);
    auto cache = model.make_cache(1, static_cast<int>(experiment.text.size()));
    const std::vector<float> logits = all_logits(model, *cache, experiment.text);
    if (original_logits.empty()) original_logits = logits;  // the first row is the original

    ConversionRow row;
    row.conversion = conversion;
    row.agreement = llm::compare_next_token_distributions(original_logits, logits, config.vocab_size);
    row.logits_vs_original = llm::compare(logits, original_logits, llm::model_logits_tolerance(llm::DType::F32));
    row.kv_bytes_per_token_formula = weights.config.kv_bytes_per_token();
    row.kv_bytes_full_context_formula = weights.config.kv_bytes_per_token() * static_cast<std::size_t>(config.seq_len);
    row.kv_bytes_full_context_measured = model.make_cache(1, config.seq_len)->bytes_allocated();
    row.forward_time = llm::time_cpu([&] { all_logits(model, *cache, experiment.text); }, 1, repeats);
    const bool finite = std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); });
    // Pooled models are not meant to match: their "check" is only that they
    // run and give finite logits; their quality is the KL / top-1 columns.
    row.ok = conversion.exact ? row.logits_vs_original.ok : finite;
    experiment.rows.push_back(std::move(row));
  }
  return experiment;
}

}  // namespace step03
