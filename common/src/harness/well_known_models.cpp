#include "llm/harness/well_known_models.hpp"

namespace llm {

const std::vector<PublishedAttention>& well_known_models() {
  static const std::vector<PublishedAttention> models = {
      {"Llama-2-7B", 32, 32, 32, 128, "MHA; trained context 4k"},
      {"Llama-2-70B", 80, 64, 8, 128, "GQA, groups of 8; trained context 4k"},
      {"Llama-3-8B", 32, 32, 8, 128, "GQA, groups of 4; trained context 8k (3.1: 128k)"},
      {"Mistral-7B", 32, 32, 8, 128, "GQA, groups of 4; v0.1 uses a 4k sliding window (a rolling cache caps it)"},
  };
  return models;
}

ModelConfig attention_config(const PublishedAttention& m) {
  ModelConfig c;
  c.dim = m.n_heads * m.head_dim;
  c.n_layers = m.n_layers;
  c.n_heads = m.n_heads;
  c.n_kv_heads = m.n_kv_heads;
  return c;
}

}  // namespace llm
