#pragma once
// The attention dims of well-known models, from their published config.json
// files: what step 03's KV-cache formula and step 05's memory replay apply
// to real models.
#include <string>
#include <vector>

#include "llm/config.hpp"

namespace llm {

struct PublishedAttention {
  std::string name;
  int n_layers;
  int n_heads;
  int n_kv_heads;
  int head_dim;
  std::string note;  // where the numbers come from / what to keep in mind
};

// Llama-2-7B (MHA 32/32), Llama-2-70B (GQA 64/8), Llama-3-8B (GQA 32/8),
// Mistral-7B (GQA 32/8).
const std::vector<PublishedAttention>& well_known_models();

// A ModelConfig with just the attention dims filled in (dim = n_heads x
// head_dim), so kv_bytes_per_token() applies.
ModelConfig attention_config(const PublishedAttention& model);

}  // namespace llm
