#include "step03_gqa/kv_cache_sizes.hpp"

#include <cmath>

namespace step03 {

const std::vector<PublishedAttention>& well_known_models() {
  static const std::vector<PublishedAttention> models = {
      {"Llama-2-7B", 32, 32, 32, 128, "MHA; trained context 4k"},
      {"Llama-2-70B", 80, 64, 8, 128, "GQA, groups of 8; trained context 4k"},
      {"Llama-3-8B", 32, 32, 8, 128, "GQA, groups of 4; trained context 8k (3.1: 128k)"},
      {"Mistral-7B", 32, 32, 8, 128, "GQA, groups of 4; v0.1 uses a 4k sliding window (a rolling cache caps it)"},
  };
  return models;
}

llm::ModelConfig attention_config(const PublishedAttention& m) {
  llm::ModelConfig c;
  c.dim = m.n_heads * m.head_dim;
  c.n_layers = m.n_layers;
  c.n_heads = m.n_heads;
  c.n_kv_heads = m.n_kv_heads;
  return c;
}

long long sequences_that_fit(double budget_bytes, double bytes_per_sequence) {
  if (bytes_per_sequence <= 0.0) return 0;
  return static_cast<long long>(std::floor(budget_bytes / bytes_per_sequence));
}

}  // namespace step03
