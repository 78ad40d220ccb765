#pragma once
// The real-model experiment: take a trained checkpoint (stories260K is itself
// GQA, 8 query heads / 4 KV heads), give it more or fewer KV heads with
// convert_kv_heads (duplicate -> MHA; mean-pool -> fewer groups, MQA), and
// measure on the original model's own generated text (teacher forcing: every
// model sees the same tokens) how far each one's next-token distributions
// move, and how much KV cache each needs.
#include <span>
#include <string>
#include <vector>

#include "llm/harness/compare.hpp"
#include "llm/harness/timer.hpp"
#include "llm/quality.hpp"
#include "llm/weights.hpp"

namespace step03 {

// One converted model.
struct KvHeadsConversion {
  std::string name;  // "original", "mha_duplicate", "gqa_mean_pool", "mqa_mean_pool"
  std::string what;  // one line
  int kv_heads = 0;
  bool exact = false;  // expected to reproduce the original logits (within fp32 tolerance)
};

// The conversions that make sense for this config: the original, MHA by
// duplication (when it is not MHA already), half the KV heads by pooling pairs
// (when that is not MQA), and MQA by pooling all.
std::vector<KvHeadsConversion> conversions_for(const llm::ModelConfig& config);

struct ConversionRow {
  KvHeadsConversion conversion;
  llm::NextTokenAgreement agreement;    // vs the original's distributions
  llm::CompareResult logits_vs_original;  // element-wise, model tolerance (meaningful for exact ones)
  std::size_t kv_bytes_per_token_formula = 0;   // ModelConfig::kv_bytes_per_token() (fp32, all layers)
  std::size_t kv_bytes_full_context_formula = 0;
  std::size_t kv_bytes_full_context_measured = 0;  // bytes_allocated() of a real one-sequence cache at seq_len
  llm::TimingStats forward_time;        // one all-rows forward over the text
  bool ok = false;                      // exact: logits match; pooled: logits finite
};

struct ConversionExperiment {
  std::vector<int> text;            // [positions] prompt + the original's continuation
  std::vector<ConversionRow> rows;  // in conversions_for() order, the original first
};

// prompt: [n] ids starting with BOS; positions: text length (<= seq_len).
// temperature/top_p/seed: how the original generates the text (0 = greedy).
ConversionExperiment run_conversion_experiment(const llm::ModelWeights& original, std::span<const int> prompt,
                                               int positions, float temperature, float top_p,
                                               unsigned long long seed, int repeats);

}  // namespace step03
