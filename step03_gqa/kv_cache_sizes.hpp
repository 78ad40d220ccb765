#pragma once
// The KV-cache formula applied to well-known models:
//   bytes = 2 (K and V) x layers x kv_heads x head_dim x positions x bytes/value
// (llm::ModelConfig::kv_bytes_per_token() x positions), and how many
// sequences of a given context fit in a memory budget.
#include <cstddef>
#include <string>
#include <vector>

#include "llm/config.hpp"

namespace step03 {

struct PublishedAttention {
  std::string name;
  int n_layers;
  int n_heads;
  int n_kv_heads;
  int head_dim;
  std::string note;  // where the numbers come from / what to keep in mind
};

// Llama-2-7B (MHA 32/32), Llama-2-70B (GQA 64/8), Llama-3-8B (GQA 32/8),
// Mistral-7B (GQA 32/8), from their published config.json files.
const std::vector<PublishedAttention>& well_known_models();

// A ModelConfig with just the attention dims filled in (dim = n_heads x
// head_dim), so common's kv_bytes_per_token() applies.
llm::ModelConfig attention_config(const PublishedAttention& model);

// Sequences of `bytes_per_sequence` that fit in `budget_bytes` (0 if none).
long long sequences_that_fit(double budget_bytes, double bytes_per_sequence);

}  // namespace step03
